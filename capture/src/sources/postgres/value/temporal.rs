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

use crate::json::write_padded;

pub use oncely_core::calendar::{
    civil_from_days, days_from_civil, DATE_INFINITY, DATE_NEG_INFINITY, MICROS_PER_DAY,
    TIMESTAMP_INFINITY, TIMESTAMP_NEG_INFINITY,
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
mod tests;
