//! `interval` text (PostgreSQL's `postgres` style and ISO 8601 durations)
//! -> months, days and microseconds kept apart, or Debezium's
//! `MicroDuration` (docs/design.md, "Dates, times and intervals").

use super::temporal::{
    fraction, Cursor, MICROS_PER_DAY, MICROS_PER_HOUR, MICROS_PER_MINUTE, MICROS_PER_MONTH,
    MICROS_PER_SECOND,
};
use crate::json::{write_i64, write_padded, write_u64};

/// An `interval` as PostgreSQL keeps it: months, days and microseconds,
/// each with its own sign, none converted into another (a month is not a
/// fixed number of days, nor a day of hours across a DST change).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IntervalParts {
    pub months: i64,
    pub days: i64,
    pub micros: i64,
}

impl IntervalParts {
    /// Debezium's `MicroDuration`: months at [`MICROS_PER_MONTH`], days at
    /// 24 h; `None` beyond 64 bits.
    pub fn to_micros(self) -> Option<i64> {
        self.months
            .checked_mul(MICROS_PER_MONTH)?
            .checked_add(self.days.checked_mul(MICROS_PER_DAY)?)?
            .checked_add(self.micros)
    }

    /// Writes Debezium's `io.debezium.time.Interval` text
    /// (`interval.handling.mode = string`): `P<y>Y<m>M<d>DT<h>H<m>M<s>S`
    /// with every part present, zeros included, each with its own sign as
    /// PostgreSQL prints it (years and months from the months, truncated
    /// toward zero; hours, minutes and seconds from the microseconds), and
    /// seconds with their fraction, trailing zeros cut:
    /// `P1Y2M3DT4H5M6.789S`, `P-1Y-2M3DT-4H-5M-6.789S`, `P0Y0M0DT0H0M0S`.
    pub fn write_iso(self, out: &mut Vec<u8>) {
        out.push(b'P');
        write_i64(out, self.months / 12);
        out.push(b'Y');
        write_i64(out, self.months % 12);
        out.push(b'M');
        write_i64(out, self.days);
        out.extend_from_slice(b"DT");
        write_i64(out, self.micros / MICROS_PER_HOUR);
        out.push(b'H');
        write_i64(out, self.micros % MICROS_PER_HOUR / MICROS_PER_MINUTE);
        out.push(b'M');
        let seconds = self.micros % MICROS_PER_MINUTE;
        if seconds < 0 {
            out.push(b'-');
        }
        let abs = seconds.unsigned_abs();
        write_u64(out, abs / 1_000_000);
        let frac = abs % 1_000_000;
        if frac != 0 {
            let mut digits = Vec::with_capacity(7);
            digits.push(b'.');
            write_padded(&mut digits, frac, 6);
            while digits.last() == Some(&b'0') {
                digits.pop();
            }
            out.extend_from_slice(&digits);
        }
        out.push(b'S');
    }
}

/// An `interval`'s text: its parts, or an infinity (PostgreSQL 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    Finite(IntervalParts),
    Infinity,
    NegInfinity,
}

/// `interval` text -> its parts, exactly.
///
/// Understands the `postgres` IntervalStyle (the default, and what capture
/// sets: `1 year 2 mons -3 days -04:05:06.789`), `postgres_verbose`
/// (`@ 1 year 2 mons 4 hours 5 mins 6.789 secs ago`) and `iso_8601`
/// (`P1Y2M3DT4H5M6.789S`). `sql_standard` output is ambiguous without the
/// column's field restriction and is not parsed.
pub fn parse_interval_parts(s: &str) -> Option<Interval> {
    match s {
        "infinity" => return Some(Interval::Infinity),
        "-infinity" => return Some(Interval::NegInfinity),
        _ => {}
    }
    if let Some(iso) = s.strip_prefix('P') {
        return parse_iso_interval(iso).map(Interval::Finite);
    }
    let (body, verbose) = match s.strip_prefix("@ ") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let (body, ago) = match body.strip_suffix(" ago") {
        Some(rest) if verbose => (rest, true),
        _ => (body, false),
    };
    let mut parts = IntervalParts::default();
    let mut tokens = body.split(' ').filter(|t| !t.is_empty()).peekable();
    let mut seen_any = false;
    while let Some(tok) = tokens.next() {
        seen_any = true;
        if tok.contains(':') {
            parts.micros = parts.micros.checked_add(clock_duration(tok)?)?;
            continue;
        }
        let unit = tokens.next()?;
        let (num, frac_micros) = signed_decimal(tok)?;
        let unit_micros = match unit.trim_end_matches('s') {
            "year" | "mon" | "day" if frac_micros != 0 => return None,
            "year" => {
                parts.months = parts.months.checked_add(num.checked_mul(12)?)?;
                continue;
            }
            "mon" => {
                parts.months = parts.months.checked_add(num)?;
                continue;
            }
            "day" => {
                parts.days = parts.days.checked_add(num)?;
                continue;
            }
            "hour" => MICROS_PER_HOUR,
            "min" => MICROS_PER_MINUTE,
            "sec" => MICROS_PER_SECOND,
            _ => return None,
        };
        let whole = num.checked_mul(unit_micros)?;
        // Fractions appear only on seconds in PostgreSQL's output.
        let part = frac_micros.checked_mul(unit_micros / MICROS_PER_SECOND)?;
        parts.micros = parts.micros.checked_add(whole)?.checked_add(part)?;
    }
    if !seen_any {
        return None;
    }
    if ago {
        parts = IntervalParts {
            months: parts.months.checked_neg()?,
            days: parts.days.checked_neg()?,
            micros: parts.micros.checked_neg()?,
        };
    }
    Some(Interval::Finite(parts))
}

/// `interval` -> µs, as Debezium's `MicroDuration` (see [`MICROS_PER_MONTH`]),
/// infinities as `i64::MAX`/`i64::MIN`; `None` beyond 64 bits.
pub fn parse_interval(s: &str) -> Option<i64> {
    match parse_interval_parts(s)? {
        Interval::Finite(parts) => parts
            .to_micros()
            .filter(|&m| m != i64::MAX && m != i64::MIN),
        Interval::Infinity => Some(i64::MAX),
        Interval::NegInfinity => Some(i64::MIN),
    }
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
fn parse_iso_interval(s: &str) -> Option<IntervalParts> {
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut parts = IntervalParts::default();
    let mut any = false;
    for (part, is_time) in [(date, false), (time.unwrap_or(""), true)] {
        let mut rest = part;
        while !rest.is_empty() {
            let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
            let (num, frac) = signed_decimal(&rest[..end])?;
            let designator = rest.as_bytes()[end];
            rest = &rest[end + 1..];
            any = true;
            let p = &mut parts;
            match (is_time, designator) {
                (false, b'Y') if frac == 0 => {
                    p.months = p.months.checked_add(num.checked_mul(12)?)?
                }
                (false, b'M') if frac == 0 => p.months = p.months.checked_add(num)?,
                (false, b'W') if frac == 0 => p.days = p.days.checked_add(num.checked_mul(7)?)?,
                (false, b'D') if frac == 0 => p.days = p.days.checked_add(num)?,
                (true, b'H') if frac == 0 => {
                    p.micros = p.micros.checked_add(num.checked_mul(MICROS_PER_HOUR)?)?
                }
                (true, b'M') if frac == 0 => {
                    p.micros = p.micros.checked_add(num.checked_mul(MICROS_PER_MINUTE)?)?
                }
                (true, b'S') => {
                    p.micros = p
                        .micros
                        .checked_add(num.checked_mul(MICROS_PER_SECOND)?)?
                        .checked_add(frac)?
                }
                _ => return None,
            }
        }
    }
    any.then_some(parts)
}
