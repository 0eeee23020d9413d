//! Date/time text forms -> Debezium's numbers and UTC strings.
//!
//! PostgreSQL's text output depends on the session: we set `DateStyle=ISO`
//! and `TimeZone=UTC` on the replication session, but parse any ISO-style
//! offset (`+00`, `+05:30`, `-03:30:15` for historical zones) anyway, and
//! the ` BC` suffix. Anything else (another DateStyle, `infinity`) is not
//! parsed here; the caller keeps the text.
//!
//! Calendar arithmetic uses chrono; formatting is hand-written into the
//! output buffer to keep the per-event path free of allocations.

use chrono::{Datelike, NaiveDate};

use super::json::write_padded;

pub const MICROS_PER_SECOND: i64 = 1_000_000;
pub const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;

/// Debezium's `MicroDuration` counts a month as the average Gregorian month,
/// 365.25 / 12 = 30.4375 days (exactly 2,629,800 s), so an interval of
/// `1 mon` becomes 2,629,800,000,000 µs — the same number a Debezium
/// connector would produce for the same column.
pub const MICROS_PER_MONTH: i64 = 2_629_800 * MICROS_PER_SECOND;

/// Days from 0001-01-01 (CE day 1) to 1970-01-01.
const UNIX_EPOCH_FROM_CE: i64 = 719_163;

/// A text cursor for the fixed ISO layouts.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            b: s.as_bytes(),
            pos: 0,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Between `min` and `max` decimal digits as a number.
    fn digits(&mut self, min: usize, max: usize) -> Option<i64> {
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

    fn at_end(&self) -> bool {
        self.pos == self.b.len()
    }
}

/// `YYYY-MM-DD` (year may be longer than four digits) -> days since epoch,
/// without the era; the caller applies ` BC`.
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

fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    let date = NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?;
    Some(i64::from(date.num_days_from_ce()) - UNIX_EPOCH_FROM_CE)
}

/// Strips a trailing ` BC` and turns the year astronomical (1 BC = year 0).
fn split_era(s: &str) -> (&str, bool) {
    match s.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (s, false),
    }
}

fn era_year(year: i64, bc: bool) -> i64 {
    if bc {
        1 - year
    } else {
        year
    }
}

/// `HH:MM:SS[.ffffff]` -> µs since midnight. Hours may be 24 only as
/// `24:00:00`, which PostgreSQL allows for `time`.
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
fn fraction(c: &mut Cursor) -> Option<i64> {
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

/// `date`: days since 1970-01-01.
pub fn parse_date(s: &str) -> Option<i32> {
    let (s, bc) = split_era(s);
    let mut c = Cursor::new(s);
    let (y, m, d) = date_part(&mut c)?;
    if !c.at_end() {
        return None;
    }
    i32::try_from(days_from_civil(era_year(y, bc), m, d)?).ok()
}

/// Shared by `timestamp` and `timestamptz`: date, separator, time; returns
/// local µs since epoch and leaves the cursor at the offset (if any).
fn local_timestamp(c: &mut Cursor, bc: bool) -> Option<i64> {
    let (y, m, d) = date_part(c)?;
    if !(c.eat(b' ') || c.eat(b'T')) {
        return None;
    }
    let tod = time_part(c)?;
    if tod >= MICROS_PER_DAY {
        return None;
    }
    let days = days_from_civil(era_year(y, bc), m, d)?;
    days.checked_mul(MICROS_PER_DAY)?.checked_add(tod)
}

/// `timestamp` (without time zone): µs since 1970-01-01 00:00:00.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let (s, bc) = split_era(s);
    let mut c = Cursor::new(s);
    let micros = local_timestamp(&mut c, bc)?;
    c.at_end().then_some(micros)
}

/// `timestamptz`: µs since the epoch, in UTC.
pub fn parse_timestamptz(s: &str) -> Option<i64> {
    let (s, bc) = split_era(s);
    let mut c = Cursor::new(s);
    let local = local_timestamp(&mut c, bc)?;
    let offset = if c.eat(b'Z') { 0 } else { offset_part(&mut c)? };
    if !c.at_end() {
        return None;
    }
    local.checked_sub(offset.checked_mul(MICROS_PER_SECOND)?)
}

/// `time`: µs since midnight (`24:00:00` is 86,400,000,000).
pub fn parse_time(s: &str) -> Option<i64> {
    let mut c = Cursor::new(s);
    let micros = time_part(&mut c)?;
    c.at_end().then_some(micros)
}

/// `timetz`: µs since midnight UTC, wrapped into one day.
pub fn parse_timetz(s: &str) -> Option<i64> {
    let mut c = Cursor::new(s);
    let local = time_part(&mut c)?;
    let offset = if c.eat(b'Z') { 0 } else { offset_part(&mut c)? };
    if !c.at_end() {
        return None;
    }
    Some((local - offset * MICROS_PER_SECOND).rem_euclid(MICROS_PER_DAY))
}

/// Writes `io.debezium.time.ZonedTimestamp` text: ISO-8601 in UTC with
/// exactly six fraction digits, e.g. `2026-11-27T15:10:35.670111Z`. A fixed
/// width keeps values sortable as strings. Years outside 0..=9999 are written
/// as java.time does (`+10000`, `-0043`). Returns false (writing nothing)
/// when the instant is outside chrono's range.
pub fn write_zoned_timestamp(out: &mut Vec<u8>, micros: i64) -> bool {
    let days = micros.div_euclid(MICROS_PER_DAY);
    let tod = micros.rem_euclid(MICROS_PER_DAY);
    let Some(date) = i32::try_from(days + UNIX_EPOCH_FROM_CE)
        .ok()
        .and_then(NaiveDate::from_num_days_from_ce_opt)
    else {
        return false;
    };
    let year = date.year();
    if year > 9999 {
        out.push(b'+');
    } else if year < 0 {
        out.push(b'-');
    }
    write_padded(out, u64::from(year.unsigned_abs()), 4);
    out.push(b'-');
    write_padded(out, u64::from(date.month()), 2);
    out.push(b'-');
    write_padded(out, u64::from(date.day()), 2);
    out.push(b'T');
    write_time_of_day(out, tod);
    true
}

/// Writes `io.debezium.time.ZonedTime` text: `HH:MM:SS.ffffffZ` in UTC.
pub fn write_zoned_time(out: &mut Vec<u8>, micros_of_day: i64) {
    write_time_of_day(out, micros_of_day.rem_euclid(MICROS_PER_DAY));
}

fn write_time_of_day(out: &mut Vec<u8>, tod: i64) {
    // tod is in 0..MICROS_PER_DAY, so every part is non-negative.
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

/// `interval` -> µs, as Debezium's `MicroDuration` (see [`MICROS_PER_MONTH`]).
///
/// Understands the `postgres` IntervalStyle (the default:
/// `1 year 2 mons -3 days -04:05:06.789`), `postgres_verbose`
/// (`@ 1 year 2 mons 4 hours 5 mins 6.789 secs ago`) and `iso_8601`
/// (`P1Y2M3DT4H5M6.789S`). `sql_standard` output is ambiguous without the
/// column's field restriction and is left as text.
pub fn parse_interval(s: &str) -> Option<i64> {
    if let Some(iso) = s.strip_prefix('P') {
        return parse_iso_interval(iso);
    }
    let (body, verbose) = match s.strip_prefix("@ ") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let (body, ago) = match body.strip_suffix(" ago") {
        Some(rest) if verbose => (rest, true),
        _ => (body, false),
    };
    let mut months: i64 = 0;
    let mut micros: i64 = 0;
    let mut tokens = body.split(' ').filter(|t| !t.is_empty()).peekable();
    let mut seen_any = false;
    while let Some(tok) = tokens.next() {
        seen_any = true;
        if tok.contains(':') {
            micros = micros.checked_add(clock_duration(tok)?)?;
            continue;
        }
        let unit = tokens.next()?;
        let (num, frac_micros) = signed_decimal(tok)?;
        let per: (i64, i64) = match unit.trim_end_matches('s') {
            "year" => (12, 0),
            "mon" => (1, 0),
            "day" => (0, MICROS_PER_DAY),
            "hour" => (0, 3600 * MICROS_PER_SECOND),
            "min" => (0, 60 * MICROS_PER_SECOND),
            "sec" => (0, MICROS_PER_SECOND),
            _ => return None,
        };
        match per {
            (m, 0) if frac_micros == 0 => months = months.checked_add(num.checked_mul(m)?)?,
            (0, unit_micros) => {
                let whole = num.checked_mul(unit_micros)?;
                // Fractions appear only on seconds in PostgreSQL's output.
                let part = frac_micros.checked_mul(unit_micros / MICROS_PER_SECOND)?;
                micros = micros.checked_add(whole)?.checked_add(part)?;
            }
            _ => return None,
        }
    }
    if !seen_any {
        return None;
    }
    let total = months.checked_mul(MICROS_PER_MONTH)?.checked_add(micros)?;
    Some(if ago { total.checked_neg()? } else { total })
}

/// `[+-]H+:MM:SS[.ffffff]` (hours unbounded) -> µs.
fn clock_duration(tok: &str) -> Option<i64> {
    let (neg, t) = match tok.as_bytes().first()? {
        b'-' => (true, &tok[1..]),
        b'+' => (false, &tok[1..]),
        _ => (false, tok),
    };
    let mut c = Cursor::new(t);
    let h = c.digits(1, 12)?;
    if !c.eat(b':') {
        return None;
    }
    let m = c.digits(2, 2)?;
    if !c.eat(b':') {
        return None;
    }
    let s = c.digits(2, 2)?;
    let frac = fraction(&mut c)?;
    if !c.at_end() || m > 59 || s > 59 {
        return None;
    }
    let v = h
        .checked_mul(3600)?
        .checked_add(m * 60 + s)?
        .checked_mul(MICROS_PER_SECOND)?
        .checked_add(frac)?;
    Some(if neg { -v } else { v })
}

/// `-12`, `+3`, `6.789` -> (whole, µs of the fraction as if the unit were
/// one second), both carrying the sign.
fn signed_decimal(tok: &str) -> Option<(i64, i64)> {
    let (neg, t) = match tok.as_bytes().first()? {
        b'-' => (true, &tok[1..]),
        b'+' => (false, &tok[1..]),
        _ => (false, tok),
    };
    let mut c = Cursor::new(t);
    let whole = c.digits(1, 18)?;
    let frac = fraction(&mut c)?;
    if !c.at_end() {
        return None;
    }
    Some(if neg { (-whole, -frac) } else { (whole, frac) })
}

/// The part after `P` of an ISO-8601 duration, e.g. `1Y-2M3DT4H5M6.5S`.
fn parse_iso_interval(s: &str) -> Option<i64> {
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut months: i64 = 0;
    let mut micros: i64 = 0;
    let mut any = false;
    for (part, is_time) in [(date, false), (time.unwrap_or(""), true)] {
        let mut rest = part;
        while !rest.is_empty() {
            let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
            let (num, frac) = signed_decimal(&rest[..end])?;
            let designator = rest.as_bytes()[end];
            rest = &rest[end + 1..];
            any = true;
            match (is_time, designator) {
                (false, b'Y') if frac == 0 => months = months.checked_add(num.checked_mul(12)?)?,
                (false, b'M') if frac == 0 => months = months.checked_add(num)?,
                (false, b'W') if frac == 0 => {
                    micros = micros.checked_add(num.checked_mul(7 * MICROS_PER_DAY)?)?
                }
                (false, b'D') if frac == 0 => {
                    micros = micros.checked_add(num.checked_mul(MICROS_PER_DAY)?)?
                }
                (true, b'H') if frac == 0 => {
                    micros = micros.checked_add(num.checked_mul(3600 * MICROS_PER_SECOND)?)?
                }
                (true, b'M') if frac == 0 => {
                    micros = micros.checked_add(num.checked_mul(60 * MICROS_PER_SECOND)?)?
                }
                (true, b'S') => {
                    micros = micros
                        .checked_add(num.checked_mul(MICROS_PER_SECOND)?)?
                        .checked_add(frac)?
                }
                _ => return None,
            }
        }
    }
    if !any {
        return None;
    }
    months.checked_mul(MICROS_PER_MONTH)?.checked_add(micros)
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, FixedOffset, Utc};
    use proptest::prelude::*;

    use super::*;

    fn zoned(micros: i64) -> String {
        let mut out = Vec::new();
        assert!(write_zoned_timestamp(&mut out, micros));
        String::from_utf8(out).unwrap()
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
        for bad in [
            "infinity",
            "-infinity",
            "2026-13-01",
            "2026-02-30",
            "26-1-1",
            "2026-01-01x",
        ] {
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
        for bad in [
            "infinity",
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
        let want = Some(1_795_792_235_670_111);
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
        assert_eq!(parse_timestamptz("infinity"), None);
        assert_eq!(parse_timestamptz("2026-11-27 15:10:35.670111"), None);
        assert_eq!(parse_timestamptz("2026-11-27 15:10:35+5"), None);
    }

    #[test]
    fn timestamptz_bc() {
        let m = parse_timestamptz("0044-03-15 12:00:00+00 BC").unwrap();
        assert_eq!(zoned(m), "-0043-03-15T12:00:00.000000Z");
    }

    #[test]
    fn zoned_timestamp_formatting() {
        assert_eq!(zoned(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(zoned(1_795_792_235_670_111), "2026-11-27T15:10:35.670111Z");
        assert_eq!(zoned(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(
            zoned(parse_timestamptz("10000-01-01 00:00:00+00").unwrap()),
            "+10000-01-01T00:00:00.000000Z"
        );
        assert!(!write_zoned_timestamp(&mut Vec::new(), i64::MAX));
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
        assert_eq!(parse_interval("2562047788:00:54.775807"), Some(i64::MAX));
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
            prop_assert_eq!(parse_timestamptz(&text), Some(micros), "{}", text);
            let want = DateTime::<Utc>::from_timestamp_micros(micros)
                .unwrap()
                .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string();
            prop_assert_eq!(zoned(micros), want);
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
                i32::try_from(days + UNIX_EPOCH_FROM_CE).unwrap()).unwrap();
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
        fn parsers_never_panic(s in "\\PC{0,40}") {
            let _ = parse_date(&s);
            let _ = parse_timestamp(&s);
            let _ = parse_timestamptz(&s);
            let _ = parse_time(&s);
            let _ = parse_timetz(&s);
            let _ = parse_interval(&s);
        }
    }
}
