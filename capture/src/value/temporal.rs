//! Date/time text forms -> Debezium's numbers and strings (docs/design.md,
//! "Wire format").
//!
//! PostgreSQL's text output depends on the session: we set `DateStyle=ISO`,
//! `IntervalStyle=postgres` and `TimeZone=UTC` on every session whose values
//! are encoded, but parse any ISO-style offset (`+00`, `+05:30`, `-03:30:15`
//! for historical zones) anyway, and the ` BC` suffix.
//!
//! The whole range PostgreSQL accepts is covered: dates from 4713 BC to
//! 5874897 AD, timestamps to 294276 AD, `infinity` and `-infinity`. Calendar
//! arithmetic is done here on `i64` (proleptic Gregorian, astronomical
//! years: 1 BC is year 0), since chrono stops at year 262143. A value an
//! integer field cannot hold is `None` here, and the caller refuses it: it
//! never goes out as a string in an integer field.

use super::json::write_padded;

pub use oncely_core::calendar::{
    civil_from_days, DATE_INFINITY, DATE_NEG_INFINITY, MICROS_PER_DAY, TIMESTAMP_INFINITY,
    TIMESTAMP_NEG_INFINITY,
};

pub const MICROS_PER_SECOND: i64 = 1_000_000;
pub(super) const MICROS_PER_HOUR: i64 = 3600 * MICROS_PER_SECOND;
pub(super) const MICROS_PER_MINUTE: i64 = 60 * MICROS_PER_SECOND;

/// Debezium's `MicroDuration` counts a month as the average Gregorian month,
/// 365.25 / 12 = 30.4375 days (exactly 2,629,800 s), so an interval of
/// `1 mon` becomes 2,629,800,000,000 µs — the same number a Debezium
/// connector would produce for the same column. Lossy: `interval.handling.mode
/// = "string"` (the default) keeps months, days and time apart.
pub const MICROS_PER_MONTH: i64 = 2_629_800 * MICROS_PER_SECOND;

/// A text cursor for the fixed ISO layouts.
pub(super) struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(s: &'a str) -> Self {
        Self {
            b: s.as_bytes(),
            pos: 0,
        }
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    pub(super) fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Between `min` and `max` decimal digits as a number.
    pub(super) fn digits(&mut self, min: usize, max: usize) -> Option<i64> {
        let start = self.pos;
        let mut v: i64 = 0;
        while self.pos - start < max {
            match self.peek() {
                Some(c) if c.is_ascii_digit() => {
                    v = v.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
                    self.pos += 1;
                }
                _ => break,
            }
        }
        (self.pos - start >= min).then_some(v)
    }

    pub(super) fn at_end(&self) -> bool {
        self.pos == self.b.len()
    }
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

/// `YYYY-MM-DD` (the year may be longer than four digits) without the era;
/// the caller applies ` BC`.
fn date_part(c: &mut Cursor) -> Option<(i64, u32, u32)> {
    let year = c.digits(4, 9)?;
    if !c.eat(b'-') {
        return None;
    }
    let month = u32::try_from(c.digits(2, 2)?).ok()?;
    if !c.eat(b'-') {
        return None;
    }
    let day = u32::try_from(c.digits(2, 2)?).ok()?;
    Some((year, month, day))
}

/// Strips a trailing ` BC`.
fn split_era(s: &str) -> (&str, bool) {
    match s.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (s, false),
    }
}

/// The astronomical year (1 BC = year 0, 44 BC = -43).
fn era_year(year: i64, bc: bool) -> i64 {
    if bc {
        1 - year
    } else {
        year
    }
}

/// `HH:MM:SS[.ffffff]` -> µs since midnight. Hours may be 24 only as
/// `24:00:00`, which PostgreSQL allows for `time` and `timetz`.
fn time_part(c: &mut Cursor) -> Option<i64> {
    let h = c.digits(2, 2)?;
    if !c.eat(b':') {
        return None;
    }
    let m = c.digits(2, 2)?;
    if !c.eat(b':') {
        return None;
    }
    let s = c.digits(2, 2)?;
    let frac = fraction(c)?;
    if m > 59 || s > 59 || h > 24 || (h == 24 && (m, s, frac) != (0, 0, 0)) {
        return None;
    }
    Some(((h * 60 + m) * 60 + s) * MICROS_PER_SECOND + frac)
}

/// Optional `.f` with 1..=6 digits -> µs.
pub(super) fn fraction(c: &mut Cursor) -> Option<i64> {
    if !c.eat(b'.') {
        return Some(0);
    }
    let start = c.pos;
    let v = c.digits(1, 6)?;
    if c.peek().is_some_and(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = c.pos - start;
    Some(v * 10_i64.pow(u32::try_from(6 - n).ok()?))
}

/// `+HH[:MM[:SS]]` / `-...` -> seconds east of UTC.
fn offset_part(c: &mut Cursor) -> Option<i64> {
    let sign = match c.peek()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    c.pos += 1;
    let h = c.digits(2, 2)?;
    let mut secs = h * 3600;
    if c.eat(b':') {
        secs += c.digits(2, 2)? * 60;
        if c.eat(b':') {
            secs += c.digits(2, 2)?;
        }
    }
    Some(sign * secs)
}

/// `date`: days since 1970-01-01; `infinity` and `-infinity` as
/// [`DATE_INFINITY`] and [`DATE_NEG_INFINITY`].
pub fn parse_date(s: &str) -> Option<i32> {
    match s {
        "infinity" => return Some(DATE_INFINITY),
        "-infinity" => return Some(DATE_NEG_INFINITY),
        _ => {}
    }
    let (s, bc) = split_era(s);
    let mut c = Cursor::new(s);
    let (y, m, d) = date_part(&mut c)?;
    if !c.at_end() {
        return None;
    }
    let days = i32::try_from(days_from_civil(era_year(y, bc), m, d)?).ok()?;
    (days != DATE_INFINITY && days != DATE_NEG_INFINITY).then_some(days)
}

/// Shared by `timestamp` and `timestamptz`: date, separator, time; returns
/// (days since epoch, µs of the day) and leaves the cursor at the offset.
fn local_timestamp(c: &mut Cursor, bc: bool) -> Option<(i64, i64)> {
    let (y, m, d) = date_part(c)?;
    if !(c.eat(b' ') || c.eat(b'T')) {
        return None;
    }
    let tod = time_part(c)?;
    if tod >= MICROS_PER_DAY {
        return None;
    }
    Some((days_from_civil(era_year(y, bc), m, d)?, tod))
}

/// `timestamp` (without time zone): µs since 1970-01-01 00:00:00, with
/// `infinity`/`-infinity` as [`TIMESTAMP_INFINITY`]/[`TIMESTAMP_NEG_INFINITY`].
/// `None` for a finite timestamp the 64 bits cannot hold apart from those
/// (from 294247-01-10 04:00:54.775807 on; PostgreSQL goes to 294276).
pub fn parse_timestamp(s: &str) -> Option<i64> {
    match s {
        "infinity" => return Some(TIMESTAMP_INFINITY),
        "-infinity" => return Some(TIMESTAMP_NEG_INFINITY),
        _ => {}
    }
    let (s, bc) = split_era(s);
    let mut c = Cursor::new(s);
    let (days, tod) = local_timestamp(&mut c, bc)?;
    if !c.at_end() {
        return None;
    }
    let micros = days.checked_mul(MICROS_PER_DAY)?.checked_add(tod)?;
    (micros != TIMESTAMP_INFINITY && micros != TIMESTAMP_NEG_INFINITY).then_some(micros)
}

/// A `timestamptz` value: an instant in UTC, or an infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZonedTimestamp {
    At {
        /// Days since 1970-01-01, UTC.
        days: i64,
        /// µs of that day.
        micros: i64,
    },
    Infinity,
    NegInfinity,
}

/// `timestamptz`, normalized to UTC.
pub fn parse_timestamptz(s: &str) -> Option<ZonedTimestamp> {
    match s {
        "infinity" => return Some(ZonedTimestamp::Infinity),
        "-infinity" => return Some(ZonedTimestamp::NegInfinity),
        _ => {}
    }
    let (s, bc) = split_era(s);
    let mut c = Cursor::new(s);
    let (days, tod) = local_timestamp(&mut c, bc)?;
    let offset = if c.eat(b'Z') { 0 } else { offset_part(&mut c)? };
    if !c.at_end() {
        return None;
    }
    let utc = tod - offset * MICROS_PER_SECOND;
    Some(ZonedTimestamp::At {
        days: days + utc.div_euclid(MICROS_PER_DAY),
        micros: utc.rem_euclid(MICROS_PER_DAY),
    })
}

/// `time`: µs since midnight (`24:00:00` is 86,400,000,000).
pub fn parse_time(s: &str) -> Option<i64> {
    let mut c = Cursor::new(s);
    let micros = time_part(&mut c)?;
    c.at_end().then_some(micros)
}

/// `timetz`: µs since midnight UTC, wrapped into one day, except that
/// `24:00:00+00` stays the end of the day (86,400,000,000), as Debezium's
/// `24:00:00Z`.
pub fn parse_timetz(s: &str) -> Option<i64> {
    let mut c = Cursor::new(s);
    let local = time_part(&mut c)?;
    let offset = if c.eat(b'Z') { 0 } else { offset_part(&mut c)? };
    if !c.at_end() {
        return None;
    }
    if local == MICROS_PER_DAY && offset == 0 {
        return Some(MICROS_PER_DAY);
    }
    Some((local - offset * MICROS_PER_SECOND).rem_euclid(MICROS_PER_DAY))
}

/// Writes an astronomical year as java.time's ISO formatter does (Debezium's
/// form): four digits at least, `+` before years above 9999, `-` before
/// negative ones (`-0043` is 44 BC).
fn write_iso_year(out: &mut Vec<u8>, year: i64) {
    if year > 9999 {
        out.push(b'+');
    } else if year < 0 {
        out.push(b'-');
    }
    write_padded(out, year.unsigned_abs(), 4);
}

/// Writes `io.debezium.time.ZonedTimestamp` text: ISO-8601 in UTC with
/// exactly six fraction digits, e.g. `2026-11-27T15:10:35.670111Z` (a fixed
/// width keeps values sortable as strings), years as [`write_iso_year`];
/// `infinity` and `-infinity` as those words (Debezium's form).
pub fn write_zoned_timestamp(out: &mut Vec<u8>, value: ZonedTimestamp) {
    let (days, micros) = match value {
        ZonedTimestamp::Infinity => return out.extend_from_slice(b"infinity"),
        ZonedTimestamp::NegInfinity => return out.extend_from_slice(b"-infinity"),
        ZonedTimestamp::At { days, micros } => (days, micros),
    };
    let (year, month, day) = civil_from_days(days);
    write_iso_year(out, year);
    out.push(b'-');
    write_padded(out, u64::from(month), 2);
    out.push(b'-');
    write_padded(out, u64::from(day), 2);
    out.push(b'T');
    write_time_of_day(out, micros);
}

/// Writes `io.debezium.time.ZonedTime` text: `HH:MM:SS.ffffffZ` in UTC
/// (`24:00:00.000000Z` for the end of the day).
pub fn write_zoned_time(out: &mut Vec<u8>, micros_of_day: i64) {
    let tod = if micros_of_day == MICROS_PER_DAY {
        micros_of_day
    } else {
        micros_of_day.rem_euclid(MICROS_PER_DAY)
    };
    write_time_of_day(out, tod);
}

fn write_time_of_day(out: &mut Vec<u8>, tod: i64) {
    // tod is in 0..=MICROS_PER_DAY, so every part is non-negative.
    let tod = tod.unsigned_abs();
    let secs = tod / 1_000_000;
    write_padded(out, secs / 3600, 2);
    out.push(b':');
    write_padded(out, secs / 60 % 60, 2);
    out.push(b':');
    write_padded(out, secs % 60, 2);
    out.push(b'.');
    write_padded(out, tod % 1_000_000, 6);
    out.push(b'Z');
}

pub use super::interval::{parse_interval, parse_interval_parts, Interval, IntervalParts};

#[cfg(test)]
mod tests {
    use chrono::{DateTime, FixedOffset, NaiveDate, Utc};
    use proptest::prelude::*;

    use super::*;

    fn at(micros: i64) -> ZonedTimestamp {
        ZonedTimestamp::At {
            days: micros.div_euclid(MICROS_PER_DAY),
            micros: micros.rem_euclid(MICROS_PER_DAY),
        }
    }

    fn zoned(value: ZonedTimestamp) -> String {
        let mut out = Vec::new();
        write_zoned_timestamp(&mut out, value);
        String::from_utf8(out).unwrap()
    }

    fn iso(parts: IntervalParts) -> String {
        let mut out = Vec::new();
        parts.write_iso(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn parts(s: &str) -> IntervalParts {
        match parse_interval_parts(s) {
            Some(Interval::Finite(p)) => p,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn dates() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("2026-11-27"), Some(20_784));
        assert_eq!(parse_date("1969-12-31"), Some(-1));
        assert_eq!(parse_date("0001-01-01"), Some(-719_162));
        // 1 BC is astronomical year 0, a leap year.
        assert_eq!(parse_date("0001-02-29 BC"), Some(-719_162 - 366 + 59));
        assert_eq!(parse_date("10000-01-01"), Some(2_932_897));
        assert_eq!(parse_date("infinity"), Some(i32::MAX));
        assert_eq!(parse_date("-infinity"), Some(i32::MIN));
        // PostgreSQL's extremes.
        assert_eq!(parse_date("4714-11-24 BC"), Some(-2_440_588));
        assert_eq!(parse_date("4713-01-01 BC"), Some(-2_440_550));
        assert_eq!(parse_date("5874897-12-31"), Some(2_145_042_905));
        for bad in ["2026-13-01", "2026-02-30", "26-1-1", "2026-01-01x"] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_timestamp("2026-11-27 15:10:35.670111"),
            Some(1_795_792_235_670_111)
        );
        assert_eq!(
            parse_timestamp("2026-11-27 15:10:35.67"),
            Some(1_795_792_235_670_000)
        );
        assert_eq!(parse_timestamp("1969-12-31 23:59:59.999999"), Some(-1));
        assert_eq!(
            parse_timestamp("2026-11-27T15:10:35"),
            Some(1_795_792_235_000_000)
        );
        assert_eq!(parse_timestamp("infinity"), Some(i64::MAX));
        assert_eq!(parse_timestamp("-infinity"), Some(i64::MIN));
        assert_eq!(
            parse_timestamp("4714-11-24 00:00:00 BC"),
            Some(-2_440_588 * MICROS_PER_DAY)
        );
        // The last µs below the +infinity sentinel; then nothing fits.
        assert_eq!(
            parse_timestamp("294247-01-10 04:00:54.775806"),
            Some(i64::MAX - 1)
        );
        for bad in [
            "294247-01-10 04:00:54.775807",
            "294276-12-31 23:59:59.999999",
            "2026-11-27",
            "2026-11-27 24:00:00",
            "2026-11-27 15:10:35.1234567",
            "2026-11-27 15:10:35+00",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn timestamptz_offsets() {
        let want = Some(at(1_795_792_235_670_111));
        assert_eq!(parse_timestamptz("2026-11-27 15:10:35.670111+00"), want);
        assert_eq!(parse_timestamptz("2026-11-27 15:10:35.670111Z"), want);
        assert_eq!(parse_timestamptz("2026-11-27 20:40:35.670111+05:30"), want);
        assert_eq!(parse_timestamptz("2026-11-27 11:40:35.670111-03:30"), want);
        assert_eq!(
            parse_timestamptz("2026-11-27 15:10:35.670111+00:00:00"),
            want
        );
        // Historical LMT offsets carry seconds.
        assert_eq!(
            parse_timestamptz("1880-01-01 00:00:00+00:53:28"),
            parse_timestamptz("1879-12-31 23:06:32+00")
        );
        assert_eq!(
            parse_timestamptz("infinity"),
            Some(ZonedTimestamp::Infinity)
        );
        assert_eq!(parse_timestamptz("2026-11-27 15:10:35.670111"), None);
        assert_eq!(parse_timestamptz("2026-11-27 15:10:35+5"), None);
    }

    #[test]
    fn timestamptz_bc_and_far_future() {
        let m = parse_timestamptz("0044-03-15 12:00:00+00 BC").unwrap();
        assert_eq!(zoned(m), "-0043-03-15T12:00:00.000000Z");
        let m = parse_timestamptz("0001-01-01 00:00:00+00 BC").unwrap();
        assert_eq!(zoned(m), "0000-01-01T00:00:00.000000Z");
        let m = parse_timestamptz("4714-11-24 00:00:00+00 BC").unwrap();
        assert_eq!(zoned(m), "-4713-11-24T00:00:00.000000Z");
        // Beyond 64-bit µs, as PostgreSQL allows for timestamptz.
        let m = parse_timestamptz("294276-12-31 23:59:59.999999+00").unwrap();
        assert_eq!(zoned(m), "+294276-12-31T23:59:59.999999Z");
        assert_eq!(zoned(ZonedTimestamp::NegInfinity), "-infinity");
    }

    #[test]
    fn zoned_timestamp_formatting() {
        assert_eq!(zoned(at(0)), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            zoned(at(1_795_792_235_670_111)),
            "2026-11-27T15:10:35.670111Z"
        );
        assert_eq!(zoned(at(-1)), "1969-12-31T23:59:59.999999Z");
        assert_eq!(
            zoned(parse_timestamptz("10000-01-01 00:00:00+00").unwrap()),
            "+10000-01-01T00:00:00.000000Z"
        );
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("00:00:00"), Some(0));
        assert_eq!(parse_time("15:10:35.670111"), Some(54_635_670_111));
        assert_eq!(parse_time("24:00:00"), Some(MICROS_PER_DAY));
        assert_eq!(parse_time("24:00:01"), None);
        assert_eq!(parse_time("12:60:00"), None);
        assert_eq!(parse_time("1:00:00"), None);
    }

    #[test]
    fn timetz_to_utc() {
        let fmt = |m: i64| {
            let mut out = Vec::new();
            write_zoned_time(&mut out, m);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            fmt(parse_timetz("15:10:35.670111+00").unwrap()),
            "15:10:35.670111Z"
        );
        assert_eq!(
            fmt(parse_timetz("15:10:35.670111+05:30").unwrap()),
            "09:40:35.670111Z"
        );
        assert_eq!(
            fmt(parse_timetz("22:00:00-03").unwrap()),
            "01:00:00.000000Z"
        );
        assert_eq!(
            fmt(parse_timetz("01:00:00+02").unwrap()),
            "23:00:00.000000Z"
        );
        assert_eq!(parse_timetz("15:10:35"), None);
        // The end of the day in UTC stays the end of the day.
        assert_eq!(
            fmt(parse_timetz("24:00:00+00").unwrap()),
            "24:00:00.000000Z"
        );
        assert_eq!(
            fmt(parse_timetz("24:00:00+01").unwrap()),
            "23:00:00.000000Z"
        );
    }

    const H: i64 = 3600 * MICROS_PER_SECOND;

    #[test]
    fn intervals_postgres_style() {
        assert_eq!(parse_interval("00:00:00"), Some(0));
        assert_eq!(parse_interval("1 day"), Some(MICROS_PER_DAY));
        assert_eq!(parse_interval("1 mon"), Some(MICROS_PER_MONTH));
        assert_eq!(
            parse_interval("1 year 2 mons 3 days 04:05:06.789"),
            Some(14 * MICROS_PER_MONTH + 3 * MICROS_PER_DAY + 4 * H + 5 * 60_000_000 + 6_789_000)
        );
        assert_eq!(
            parse_interval("-1 years -2 mons +3 days -04:05:06"),
            Some(
                -14 * MICROS_PER_MONTH + 3 * MICROS_PER_DAY - (4 * H + 5 * 60_000_000 + 6_000_000)
            )
        );
        assert_eq!(parse_interval("-00:00:00.5"), Some(-500_000));
        assert_eq!(parse_interval("100:00:00"), Some(100 * H));
        assert_eq!(
            parse_interval("2562047788:00:54.775806"),
            Some(i64::MAX - 1)
        );
        // i64::MAX is +infinity's sentinel.
        assert_eq!(parse_interval("2562047788:00:54.775807"), None);
    }

    #[test]
    fn intervals_month_is_debezium_average() {
        // 12 months = 365.25 days.
        assert_eq!(
            parse_interval("1 year"),
            Some(36_525 * MICROS_PER_DAY / 100)
        );
    }

    #[test]
    fn intervals_verbose_and_iso() {
        let want =
            Some(14 * MICROS_PER_MONTH + 3 * MICROS_PER_DAY + 4 * H + 5 * 60_000_000 + 6_789_000);
        assert_eq!(
            parse_interval("@ 1 year 2 mons 3 days 4 hours 5 mins 6.789 secs"),
            want
        );
        assert_eq!(parse_interval("P1Y2M3DT4H5M6.789S"), want);
        assert_eq!(parse_interval("@ 1 day ago"), Some(-MICROS_PER_DAY));
        assert_eq!(
            parse_interval("P-1DT-0.5S"),
            Some(-MICROS_PER_DAY - 500_000)
        );
        assert_eq!(parse_interval("PT0S"), Some(0));
    }

    #[test]
    fn intervals_keep_months_days_and_time_apart() {
        assert_eq!(
            iso(parts("1 year 2 mons 3 days 04:05:06.789")),
            "P1Y2M3DT4H5M6.789S"
        );
        assert_eq!(
            iso(parts("-1 years -2 mons +3 days -04:05:06.789")),
            "P-1Y-2M3DT-4H-5M-6.789S"
        );
        assert_eq!(iso(parts("00:00:00")), "P0Y0M0DT0H0M0S");
        assert_eq!(iso(parts("-00:00:00.5")), "P0Y0M0DT0H0M-0.5S");
        assert_eq!(
            iso(parts("10303:05:06.000001")),
            "P0Y0M0DT10303H5M6.000001S"
        );
        assert_eq!(iso(parts("-178000000 years")), "P-178000000Y0M0DT0H0M0S");
        assert_eq!(iso(parts("1 year -1 mons")), "P0Y11M0DT0H0M0S");
        assert_eq!(parse_interval_parts("infinity"), Some(Interval::Infinity));
        // Beyond 64-bit µs: exact as parts, refused as MicroDuration.
        assert_eq!(parse_interval("-178000000 years"), None);
        assert_eq!(parse_interval("infinity"), Some(i64::MAX));
    }

    #[test]
    fn intervals_rejected() {
        for bad in [
            "",
            "1",
            "1 fortnight",
            "1-2 3 4:05:06",
            "1.5 mons",
            "P",
            "P1X",
            "99999999999999999 years",
        ] {
            assert_eq!(parse_interval(bad), None, "{bad}");
        }
    }

    /// PostgreSQL prints fraction digits only when non-zero, trailing zeros cut.
    fn pg_timestamptz_text(micros: i64, offset_secs: i32) -> String {
        let offset = FixedOffset::east_opt(offset_secs).unwrap();
        let dt = DateTime::<Utc>::from_timestamp_micros(micros)
            .unwrap()
            .with_timezone(&offset);
        let mut s = dt.format("%Y-%m-%d %H:%M:%S").to_string();
        let frac = micros.rem_euclid(1_000_000);
        if frac != 0 {
            s.push_str(format!(".{frac:06}").trim_end_matches('0'));
        }
        let abs = offset_secs.unsigned_abs();
        s.push(if offset_secs < 0 { '-' } else { '+' });
        s.push_str(&format!("{:02}", abs / 3600));
        if !abs.is_multiple_of(3600) {
            s.push_str(&format!(":{:02}", abs / 60 % 60));
            if !abs.is_multiple_of(60) {
                s.push_str(&format!(":{:02}", abs % 60));
            }
        }
        s
    }

    // 0001-01-01 .. 9999-12-31 in µs.
    const MIN_MICROS: i64 = -62_135_596_800_000_000;
    const MAX_MICROS: i64 = 253_402_300_799_999_999;

    proptest! {
        #[test]
        fn timestamptz_text_round_trips(
            micros in MIN_MICROS + 86_400_000_000..MAX_MICROS - 86_400_000_000,
            offset in -15 * 3600..15 * 3600i32,
        ) {
            let text = pg_timestamptz_text(micros, offset);
            prop_assert_eq!(parse_timestamptz(&text), Some(at(micros)), "{}", text);
            let want = DateTime::<Utc>::from_timestamp_micros(micros)
                .unwrap()
                .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string();
            prop_assert_eq!(zoned(at(micros)), want);
        }

        #[test]
        fn timestamp_text_round_trips(micros in MIN_MICROS..MAX_MICROS) {
            let text = pg_timestamptz_text(micros, 0);
            let local = text.trim_end_matches("+00");
            prop_assert_eq!(parse_timestamp(local), Some(micros), "{}", local);
        }

        #[test]
        fn date_text_round_trips(days in -719_162..2_932_896i64) {
            let date = NaiveDate::from_num_days_from_ce_opt(
                i32::try_from(days + 719_163).unwrap()).unwrap();
            let text = date.format("%Y-%m-%d").to_string();
            prop_assert_eq!(parse_date(&text).map(i64::from), Some(days));
        }

        #[test]
        fn interval_clock_round_trips(micros in -1_000_000_000_000_000i64..1_000_000_000_000_000) {
            let abs = micros.unsigned_abs();
            let secs = abs / 1_000_000;
            let mut text = format!(
                "{}{:02}:{:02}:{:02}",
                if micros < 0 { "-" } else { "" },
                secs / 3600,
                secs / 60 % 60,
                secs % 60
            );
            if abs % 1_000_000 != 0 {
                text.push_str(format!(".{:06}", abs % 1_000_000).trim_end_matches('0'));
            }
            prop_assert_eq!(parse_interval(&text), Some(micros), "{}", text);
        }

        #[test]
        fn civil_days_round_trip(days in -2_500_000i64..2_146_000_000) {
            let (y, m, d) = civil_from_days(days);
            prop_assert_eq!(days_from_civil(y, m, d), Some(days));
        }

        /// The ISO form of any interval reads back as the same parts (the
        /// designators each carry their own sign, so nothing is lost).
        #[test]
        fn interval_iso_round_trips(
            months in -2_136_000_000i64..2_136_000_000,
            days in -2_147_483_648i64..2_147_483_647,
            micros in any::<i64>(),
        ) {
            let p = IntervalParts { months, days, micros };
            let text = iso(p);
            prop_assert_eq!(parse_interval_parts(&text), Some(Interval::Finite(p)), "{}", text);
        }

        /// PostgreSQL's own output of an interval's parts reads back exactly.
        #[test]
        fn interval_postgres_text_round_trips(
            months in -2_136_000_000i64..2_136_000_000,
            days in -2_147_483_648i64..2_147_483_647,
            micros in -9_223_372_036_854_775_807i64..9_223_372_036_854_775_807,
        ) {
            let mut text = Vec::new();
            let (y, m) = (months / 12, months % 12);
            if y != 0 { text.push(format!("{y} year{}", if y.abs() == 1 { "" } else { "s" })); }
            if m != 0 { text.push(format!("{m} mon{}", if m.abs() == 1 { "" } else { "s" })); }
            if days != 0 {
                let sign = if days > 0 && (y < 0 || m < 0) { "+" } else { "" };
                text.push(format!("{sign}{days} day{}", if days.abs() == 1 { "" } else { "s" }));
            }
            if micros != 0 || text.is_empty() {
                let abs = micros.unsigned_abs();
                let secs = abs / 1_000_000;
                let sign = if micros < 0 { "-" } else if !text.is_empty() && (days < 0 || months < 0) { "+" } else { "" };
                let mut clock = format!("{sign}{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
                if abs % 1_000_000 != 0 {
                    clock.push_str(format!(".{:06}", abs % 1_000_000).trim_end_matches('0'));
                }
                text.push(clock);
            }
            let text = text.join(" ");
            let want = IntervalParts { months, days, micros };
            prop_assert_eq!(parse_interval_parts(&text), Some(Interval::Finite(want)), "{}", text);
        }

        #[test]
        fn parsers_never_panic(s in "\\PC{0,40}") {
            let _ = parse_date(&s);
            let _ = parse_timestamp(&s);
            let _ = parse_timestamptz(&s);
            let _ = parse_time(&s);
            let _ = parse_timetz(&s);
            let _ = parse_interval(&s);
            let _ = parse_interval_parts(&s);
        }
    }
}
