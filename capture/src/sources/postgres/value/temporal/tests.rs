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
        Some(-14 * MICROS_PER_MONTH + 3 * MICROS_PER_DAY - (4 * H + 5 * 60_000_000 + 6_000_000))
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
