//! From event columns to PostgreSQL columns: the type a new column gets, whether an
//! existing column accepts a value, and how a JSON value becomes SQL.
//!
//! With schemas on, the Connect type and Debezium semantic name decide
//! (`io.debezium.time.ZonedTimestamp` -> `timestamptz`, `MicroTimestamp` ->
//! `timestamp`, `Date` -> `date`, decimal strings with
//! `__debezium.source.column.*` parameters -> `numeric(p,s)`, ...). With schemas
//! off the type is inferred from the JSON value (integer -> `bigint`, other
//! numbers -> `double precision`, string -> `text`, array/object -> `jsonb`),
//! so an epoch-micros timestamp lands as `bigint`: enable schemas for typed targets.
//!
//! Arrays of dates, timestamps and times (items `io.debezium.time.Date`,
//! `MicroTimestamp`, `Timestamp`, `NanoTimestamp`, `MicroTime`, `Time`)
//! become typed array columns (`date[]`, `timestamp[]`, `time[]`), their
//! items converted from the epoch numbers to PostgreSQL text in Rust
//! ([`Temporal`]), so nested arrays and NULL items keep their shape; a
//! column that already exists as `jsonb` (created by earlier versions) keeps
//! taking the JSON text.
//!
//! Debezium's own encodings (Connect `Decimal`, millisecond times, ...) never
//! reach this module: decoding turns them into oncely's (`crate::debezium`).
//! **Limit:** arrays of other semantic types go to `jsonb`.
//!
//! Every value travels as text in one `text[]` parameter per column and is
//! converted in SQL ([`ColumnSpec::select_expr`]), so a batch is one statement
//! whatever the column types.

use std::borrow::Cow;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use oncely_core::calendar::{civil_from_days, MICROS_PER_DAY};
use serde_json::Value;

use crate::native::iso_time;

const MILLIS_PER_DAY: i64 = MICROS_PER_DAY / 1000;

/// PostgreSQL's longest bit string type (`MaxAttrSize` in bits).
const MAX_BIT_LENGTH: u32 = 83_886_080;

/// How a text value is turned into the column's value in SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Conv {
    /// A plain cast from the text form.
    Cast,
    /// Integer microseconds since the epoch (or `infinity`) -> timestamp.
    EpochMicros,
    /// Integer milliseconds since the epoch -> timestamp.
    EpochMillis,
    /// Integer nanoseconds since the epoch -> timestamp.
    EpochNanos,
    /// Integer days since the epoch (or `infinity`) -> date.
    EpochDays,
    /// Integer microseconds since midnight -> time.
    MicrosOfDay,
    /// Integer milliseconds since midnight -> time.
    MillisOfDay,
    /// Integer microseconds (Debezium's lossy `MicroDuration`) -> interval;
    /// other text (an ISO-8601 `io.debezium.time.Interval`) is cast.
    Micros,
    /// An ISO-8601 instant as java.time writes it (`io.debezium.time.ZonedTimestamp`):
    /// signed astronomical years (`-0043` is 44 BC, `+10000`) become the
    /// era form PostgreSQL reads (`0044-... BC`), then a cast.
    Zoned,
    /// Base64 text -> bytea.
    Base64,
    /// Debezium's `Geometry` struct (JSON text) -> its extended WKB as
    /// bytea ([`crate::native::geometry_ewkb`]); a `json`/`jsonb` column
    /// (created before this mapping) takes the JSON text.
    Geometry,
    /// An array of epoch numbers of this kind -> a typed array: each item
    /// converted to PostgreSQL text before the array is sent.
    Each(Temporal),
}

/// An epoch number Debezium writes for a date or time, as an array item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Temporal {
    /// Days since 1970-01-01 -> `date`.
    Days,
    /// Microseconds since the epoch -> `timestamp`.
    Micros,
    /// Milliseconds since the epoch -> `timestamp`.
    Millis,
    /// Nanoseconds since the epoch -> `timestamp` (microseconds kept).
    Nanos,
    /// Microseconds since midnight -> `time`.
    MicrosOfDay,
    /// Milliseconds since midnight -> `time`.
    MillisOfDay,
}

impl Temporal {
    /// The item kind of a column conversion, for the scalar conversions that have one.
    fn of(conv: Conv) -> Option<Self> {
        Some(match conv {
            Conv::EpochDays => Temporal::Days,
            Conv::EpochMicros => Temporal::Micros,
            Conv::EpochMillis => Temporal::Millis,
            Conv::EpochNanos => Temporal::Nanos,
            Conv::MicrosOfDay => Temporal::MicrosOfDay,
            Conv::MillisOfDay => Temporal::MillisOfDay,
            _ => return None,
        })
    }

    /// PostgreSQL input text for an item: an epoch number converted
    /// (`20454` days -> `2026-01-01`, years before 1 as `... BC`), a string
    /// (`infinity`) as it is; `None` for anything else.
    pub fn text(self, item: &Value) -> Option<String> {
        let n = match item {
            Value::String(s) => return Some(s.clone()),
            Value::Number(n) => n.as_i64()?,
            _ => return None,
        };
        // PostgreSQL's own infinity sentinels, as capture sends them (the
        // scalar columns' rule: `Conv::pg_text`).
        let infinite = match (self, n) {
            (Temporal::Days, n) if n == i64::from(i32::MAX) => Some("infinity"),
            (Temporal::Days, n) if n == i64::from(i32::MIN) => Some("-infinity"),
            (Temporal::Micros, i64::MAX) => Some("infinity"),
            (Temporal::Micros, i64::MIN) => Some("-infinity"),
            _ => None,
        };
        if let Some(word) = infinite {
            return Some(word.to_owned());
        }
        Some(match self {
            Temporal::Days => date_text(n),
            Temporal::Micros => timestamp_text(n),
            // Days apart: the latest timestamps' µs do not fit an i64.
            Temporal::Millis => day_and_time_text(
                n.div_euclid(MILLIS_PER_DAY),
                n.rem_euclid(MILLIS_PER_DAY) * 1000,
            ),
            Temporal::Nanos => timestamp_text(n.div_euclid(1000)),
            Temporal::MicrosOfDay => iso_time(n),
            Temporal::MillisOfDay => iso_time(n.checked_mul(1000)?),
        })
    }
}

/// `YYYY-MM-DD`, or `YYYY-MM-DD BC` before year 1.
fn date_text(days: i64) -> String {
    let (year, month, day) = civil_from_days(days);
    if year <= 0 {
        format!("{:04}-{month:02}-{day:02} BC", 1 - year)
    } else {
        format!("{year:04}-{month:02}-{day:02}")
    }
}

/// `YYYY-MM-DD HH:MM:SS.ffffff`, the era last (`... BC`).
fn timestamp_text(micros: i64) -> String {
    day_and_time_text(
        micros.div_euclid(MICROS_PER_DAY),
        micros.rem_euclid(MICROS_PER_DAY),
    )
}

/// [`timestamp_text`] of a day since the epoch and µs into it.
fn day_and_time_text(days: i64, tod: i64) -> String {
    let date = date_text(days);
    match date.strip_suffix(" BC") {
        Some(d) => format!("{d} {} BC", iso_time(tod)),
        None => format!("{date} {}", iso_time(tod)),
    }
}

/// A column as the events describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    /// The type a new column is created with, e.g. `numeric(12,2)`.
    pub ddl: Cow<'static, str>,
    /// How values are converted.
    pub conv: Conv,
    /// True when inferred from a JSON value (schemas off): compatibility is lenient.
    pub inferred: bool,
    /// The source column's `attnum` (capture's `__oncely.attnum` field
    /// parameter), when the event says it: a rename keeps it.
    pub attnum: Option<i16>,
}

impl ColumnSpec {
    fn new(ddl: impl Into<Cow<'static, str>>, conv: Conv) -> Self {
        Self {
            ddl: ddl.into(),
            conv,
            inferred: false,
            attnum: None,
        }
    }

    /// The SQL expression turning text `v` into a value of the existing column type `actual`.
    pub fn select_expr(&self, v: &str, actual: &str) -> String {
        let conv = if is_text(actual) || takes_json(self.conv, actual) {
            Conv::Cast
        } else {
            self.conv
        };
        let int = format!("{v} ~ '^-?[0-9]+$'");
        let value = match conv {
            Conv::Cast => v.to_owned(),
            // Whole days and the µs of the day apart: `bigint * interval`
            // multiplies in double precision, which is not exact beyond
            // 2^53 µs (year 2255).
            Conv::EpochMicros => format!("CASE WHEN {int} THEN 'epoch'::timestamp + ({v}::bigint / 86400000000) * interval '1 day' + ({v}::bigint % 86400000000) * interval '1 microsecond' ELSE {v}::timestamp END"),
            Conv::EpochMillis => format!("CASE WHEN {int} THEN 'epoch'::timestamp + {v}::bigint * interval '1 millisecond' ELSE {v}::timestamp END"),
            Conv::EpochNanos => format!("CASE WHEN {int} THEN 'epoch'::timestamp + ({v}::bigint / 1000) * interval '1 microsecond' ELSE {v}::timestamp END"),
            Conv::EpochDays => format!("CASE WHEN {int} THEN 'epoch'::date + {v}::integer ELSE {v}::date END"),
            // `24:00:00` comes as text (see `Conv::pg_text`): time + interval
            // wraps, so a MySQL TIME outside the day (`-01:00:00`,
            // `838:59:59`) is refused rather than stored as another time.
            Conv::MicrosOfDay => format!("CASE WHEN {int} THEN {} ELSE {v}::time END", time_of_day(v, "microsecond", 86_400_000_000)),
            Conv::MillisOfDay => time_of_day(v, "millisecond", 86_400_000),
            // Read as text, the µs are exact (`bigint * interval` is double precision).
            Conv::Micros => format!("CASE WHEN {int} THEN ({v} || ' microseconds')::interval ELSE {v}::interval END"),
            Conv::Zoned => v.to_owned(),
            Conv::Base64 | Conv::Geometry => format!("decode({v}, 'base64')"),
            // Items converted in Rust (`to_text_as`): the array text casts.
            Conv::Each(_) => v.to_owned(),
        };
        // PostgreSQL rounds a value to a `numeric(p,s)` column's scale without
        // a word; a value that does not fit exactly must be refused instead
        // (a data error, so the record is dead-lettered with this text).
        if conv == Conv::Cast && matches!(Exact::parse(actual), Some(Exact::Decimal(..))) {
            return format!(
                "(CASE WHEN ({value})::numeric = (({value})::numeric)::{actual} \
                 THEN ({value})::{actual} \
                 ELSE ('oncely: ' || ({value}) || ' does not fit {actual} without rounding')::{actual} END)"
            );
        }
        format!("({value})::{actual}")
    }
}

/// SQL turning the integer text `v`, a count of `unit`s since midnight,
/// into a `time`: a count outside `0..per_day` is refused with a data error
/// (the record's dead letter) instead of wrapping.
fn time_of_day(v: &str, unit: &str, per_day: i64) -> String {
    format!(
        "CASE WHEN {v}::bigint >= 0 AND {v}::bigint < {per_day} \
         THEN '00:00'::time + {v}::bigint * interval '1 {unit}' \
         ELSE ('oncely: ' || {v} || ' {unit}s is outside the day a time holds')::time END"
    )
}

impl Conv {
    /// The text PostgreSQL reads for a wire value `text` bound for a column
    /// of type `actual`: PostgreSQL's own sentinels for infinity (`i64::MAX`
    /// / `i64::MIN` µs, `i32::MAX` / `i32::MIN` days, as capture sends them)
    /// become `infinity` / `-infinity`, the end of the day (86,400,000,000 µs)
    /// `24:00:00`, and a signed ISO year the era form. Text columns take the
    /// wire text as it is.
    pub fn pg_text<'v>(self, text: Cow<'v, str>, actual: &str) -> Cow<'v, str> {
        if is_text(actual) || takes_json(self, actual) {
            return text;
        }
        if self == Conv::Geometry {
            // Not a Geometry struct: sent as it is, `decode` refuses it
            // (a data error, the record's dead letter).
            let ewkb = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| crate::native::geometry_ewkb(&v));
            return match ewkb {
                Some(bytes) => Cow::Owned(BASE64.encode(bytes)),
                None => text,
            };
        }
        let word = match (self, text.as_ref()) {
            (Conv::EpochMicros, "9223372036854775807") => "infinity",
            (Conv::EpochMicros, "-9223372036854775808") => "-infinity",
            (Conv::EpochDays, "2147483647") => "infinity",
            (Conv::EpochDays, "-2147483648") => "-infinity",
            (Conv::MicrosOfDay, "86400000000") => "24:00:00",
            (Conv::Zoned, _) => return iso_era(text),
            // `bigint * interval` multiplies in double precision: milliseconds
            // before 4253 BC or so lose digits, and `/ 1000` would round
            // nanoseconds before 1970 up. The exact Rust conversion of the
            // array items instead (nanoseconds floored to the µs).
            (Conv::EpochMillis | Conv::EpochNanos, t) => {
                let exact = t
                    .parse::<i64>()
                    .ok()
                    .and_then(|n| Temporal::of(self)?.text(&Value::from(n)));
                return exact.map_or(text, Cow::Owned);
            }
            _ => return text,
        };
        Cow::Borrowed(word)
    }
}

/// `-0043-03-15T12:00:00.000000Z` -> `0044-03-15T12:00:00.000000Z BC`,
/// `+10000-...` -> `10000-...`, year `0000` -> `0001 ... BC`; anything else
/// as it is.
fn iso_era(text: Cow<'_, str>) -> Cow<'_, str> {
    let t = text.as_ref();
    let (negative, body) = match t.as_bytes().first() {
        Some(b'-') if t.len() > 1 && t.as_bytes()[1].is_ascii_digit() => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        Some(b'0') if t.starts_with("0000-") => (true, t),
        _ => return text,
    };
    let digits = body.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(year) = body[..digits].parse::<i64>() else {
        return text;
    };
    let rest = &body[digits..];
    if negative {
        // Astronomical year -n is (n + 1) BC.
        Cow::Owned(format!("{:04}{rest} BC", year + 1))
    } else {
        Cow::Owned(format!("{year:04}{rest}"))
    }
}

/// The base name of a type as `format_type` prints it, without modifiers: `numeric(12,2)` -> `numeric`.
pub fn base_type(t: &str) -> String {
    match t.find('(') {
        Some(i) => {
            let tail = t[i..].find(')').map_or("", |j| &t[i + j + 1..]);
            format!("{}{}", t[..i].trim_end(), tail)
        }
        None => t.to_owned(),
    }
}

/// Whether a column of type `actual` takes values of `conv` as their JSON
/// text: a Geometry column created as `jsonb` before it was mapped to
/// `bytea` (see [`super::compat::compatible`]).
fn takes_json(conv: Conv, actual: &str) -> bool {
    conv == Conv::Geometry && matches!(actual, "jsonb" | "json")
}

pub(super) fn is_text(actual: &str) -> bool {
    matches!(
        base_type(actual).as_str(),
        "text" | "character varying" | "character"
    )
}

/// A type of the exact-number family, by what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exact {
    /// `smallint`, `integer`, `bigint`: bits.
    Int(u32),
    /// `numeric(precision, scale)`.
    Decimal(u32, u32),
    /// `numeric` without modifiers: any value.
    Unbounded,
}

impl Exact {
    pub(super) fn parse(t: &str) -> Option<Self> {
        Some(match t {
            "smallint" => Exact::Int(16),
            "integer" => Exact::Int(32),
            "bigint" => Exact::Int(64),
            "numeric" => Exact::Unbounded,
            _ => {
                let inner = t.strip_prefix("numeric(")?.strip_suffix(')')?;
                let (p, s) = inner.split_once(',').unwrap_or((inner, "0"));
                Exact::Decimal(p.trim().parse().ok()?, s.trim().parse().ok()?)
            }
        })
    }

    /// (digits before the point, digits after it) it holds in full.
    pub(super) fn digits(self) -> Option<(u32, u32)> {
        match self {
            Exact::Int(16) => Some((5, 0)),
            Exact::Int(32) => Some((10, 0)),
            Exact::Int(_) => Some((19, 0)),
            Exact::Decimal(p, s) => Some((p.saturating_sub(s), s)),
            Exact::Unbounded => None,
        }
    }
}

/// The spec of one field of a Connect `struct` schema, with the source
/// column's attnum when capture sent it.
pub fn from_schema(field: &Value) -> ColumnSpec {
    let mut spec = spec_of_type(field);
    spec.attnum = field
        .get("parameters")
        .and_then(|p| p.get(PARAM_ATTNUM))
        .and_then(Value::as_str)
        .and_then(|a| a.parse().ok());
    spec
}

/// Field parameter naming the source column's attnum (capture's
/// `oncely_capture::envelope::PARAM_ATTNUM`).
pub const PARAM_ATTNUM: &str = "__oncely.attnum";

fn spec_of_type(field: &Value) -> ColumnSpec {
    let ty = field.get("type").and_then(Value::as_str).unwrap_or("");
    let name = field.get("name").and_then(Value::as_str).unwrap_or("");
    let param = |k: &str| {
        field
            .get("parameters")
            .and_then(|p| p.get(k))
            .and_then(Value::as_str)
    };
    match name {
        "io.debezium.time.ZonedTimestamp" => return ColumnSpec::new("timestamptz", Conv::Zoned),
        "io.debezium.time.MicroTimestamp" => {
            return ColumnSpec::new("timestamp", Conv::EpochMicros)
        }
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
            return ColumnSpec::new("timestamp", Conv::EpochMillis)
        }
        "io.debezium.time.NanoTimestamp" => return ColumnSpec::new("timestamp", Conv::EpochNanos),
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => {
            return ColumnSpec::new("date", Conv::EpochDays)
        }
        "io.debezium.time.MicroTime" => return ColumnSpec::new("time", Conv::MicrosOfDay),
        "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time" => {
            return ColumnSpec::new("time", Conv::MillisOfDay)
        }
        "io.debezium.time.ZonedTime" => return ColumnSpec::new("timetz", Conv::Cast),
        "io.debezium.time.MicroDuration" => return ColumnSpec::new("interval", Conv::Micros),
        // Exact: PostgreSQL reads the ISO-8601 designators, signed parts and
        // fractional seconds included (`P-1Y-2M3DT-4H-5M-6.789S`).
        "io.debezium.time.Interval" => return ColumnSpec::new("interval", Conv::Cast),
        "io.debezium.data.Json" => return ColumnSpec::new("jsonb", Conv::Cast),
        "io.debezium.data.Uuid" => return ColumnSpec::new("uuid", Conv::Cast),
        // MySQL's spatial types, without PostGIS: the extended WKB.
        "io.debezium.data.geometry.Geometry" => return ColumnSpec::new("bytea", Conv::Geometry),
        // MySQL's YEAR: 1901..2155 or 0, sent as int32.
        "io.debezium.time.Year" => return ColumnSpec::new("smallint", Conv::Cast),
        // MySQL's ENUM and SET: the label, the labels joined by commas as
        // MySQL prints them (a label cannot hold a comma, so
        // `string_to_array(c, ',')` splits them exactly).
        "io.debezium.data.Enum" | "io.debezium.data.EnumSet" => {
            return ColumnSpec::new("text", Conv::Cast)
        }
        _ => {}
    }
    let source_type = param("__debezium.source.column.type").unwrap_or("");
    if ty == "string" && source_type == "VARCHAR" {
        let length = param("__debezium.source.column.length").and_then(|s| s.parse::<u32>().ok());
        return match length {
            Some(n) if (1..=10_485_760).contains(&n) => {
                ColumnSpec::new(format!("character varying({n})"), Conv::Cast)
            }
            _ => ColumnSpec::new("text", Conv::Cast),
        };
    }
    // Debezium's `Bits` (MySQL's BIT(n), PostgreSQL's bit and varbit) as
    // the bit string of its `length` (`crate::debezium`); `varying`, so a
    // varbit's shorter values fit too. oncely's own capture sends bit
    // strings as plain text, without `length`: those stay `text`.
    if ty == "string" && matches!(source_type, "BIT" | "VARBIT") {
        if let Some(length) = param("length") {
            return match length.parse::<u32>() {
                Ok(n) if (1..=MAX_BIT_LENGTH).contains(&n) => {
                    ColumnSpec::new(format!("bit varying({n})"), Conv::Cast)
                }
                _ => ColumnSpec::new("bit varying", Conv::Cast),
            };
        }
    }
    if ty == "string" && is_numeric_source_type(source_type) {
        let precision =
            param("__debezium.source.column.length").and_then(|s| s.parse::<u32>().ok());
        let scale = param("__debezium.source.column.scale").and_then(|s| s.parse::<u32>().ok());
        return match (precision, scale) {
            (Some(p), Some(s)) if (1..=1000).contains(&p) && s <= p => {
                ColumnSpec::new(format!("numeric({p},{s})"), Conv::Cast)
            }
            _ => ColumnSpec::new("numeric", Conv::Cast),
        };
    }
    match ty {
        "boolean" => ColumnSpec::new("boolean", Conv::Cast),
        "int8" | "int16" => ColumnSpec::new("smallint", Conv::Cast),
        "int32" => ColumnSpec::new("integer", Conv::Cast),
        "int64" => ColumnSpec::new("bigint", Conv::Cast),
        "float" | "float32" => ColumnSpec::new("real", Conv::Cast),
        "double" | "float64" => ColumnSpec::new("double precision", Conv::Cast),
        "bytes" => ColumnSpec::new("bytea", Conv::Base64),
        "array" => match field.get("items").map(from_schema) {
            Some(item) if item.ddl.ends_with("[]") => ColumnSpec::new("jsonb", Conv::Cast),
            // Zoned items are converted one by one (`to_text_as`).
            Some(item) if matches!(item.conv, Conv::Cast | Conv::Zoned) => {
                ColumnSpec::new(format!("{}[]", item.ddl), Conv::Cast)
            }
            Some(item) => match Temporal::of(item.conv) {
                Some(t) => ColumnSpec::new(format!("{}[]", item.ddl), Conv::Each(t)),
                None => ColumnSpec::new("jsonb", Conv::Cast),
            },
            None => ColumnSpec::new("jsonb", Conv::Cast),
        },
        "struct" | "map" => ColumnSpec::new("jsonb", Conv::Cast),
        _ => ColumnSpec::new("text", Conv::Cast),
    }
}

/// The spec inferred from a JSON value (schemas off); `None` for null (type unknown yet).
pub fn infer(value: &Value) -> Option<ColumnSpec> {
    let ddl: &'static str = match value {
        Value::Null => return None,
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "bigint",
        Value::Number(_) => "double precision",
        Value::String(_) => "text",
        Value::Array(_) | Value::Object(_) => "jsonb",
    };
    Some(ColumnSpec {
        ddl: Cow::Borrowed(ddl),
        conv: Conv::Cast,
        inferred: true,
        attnum: None,
    })
}

/// The text a JSON value is sent as, for a column of type `actual`, with
/// the items of an array converted by `each` (see [`Conv::Each`]); `None`
/// for SQL NULL.
pub fn to_text_as<'v>(
    value: &'v Value,
    actual: &str,
    each: Option<Temporal>,
) -> Option<Cow<'v, str>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        Value::Array(items) if actual.ends_with("[]") => {
            let mut out = String::from("{");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match item {
                    Value::Null => out.push_str("NULL"),
                    Value::Array(_) => {
                        out.push_str(&to_text_as(item, actual, each).unwrap_or_default())
                    }
                    other => {
                        let text = match (each.and_then(|t| t.text(other)), other) {
                            (Some(t), _) => t,
                            // Signed ISO years of `timestamptz[]` items in
                            // the era form PostgreSQL reads.
                            (None, Value::String(s))
                                if actual.starts_with("timestamp with time zone") =>
                            {
                                iso_era(Cow::Borrowed(s)).into_owned()
                            }
                            (None, Value::String(s)) => s.clone(),
                            (None, v) => v.to_string(),
                        };
                        out.push('"');
                        out.push_str(&text.replace('\\', "\\\\").replace('"', "\\\""));
                        out.push('"');
                    }
                }
            }
            out.push('}');
            Some(Cow::Owned(out))
        }
        other => Some(Cow::Owned(other.to_string())),
    }
}

/// Whether a propagated source type is a number sent as text: PostgreSQL's
/// NUMERIC and MONEY, MySQL's DECIMAL and BIGINT UNSIGNED, whose names
/// carry their attributes (`DECIMAL UNSIGNED ZEROFILL`).
fn is_numeric_source_type(source_type: &str) -> bool {
    let mut words = source_type.split(' ');
    match words.next() {
        Some("NUMERIC" | "DECIMAL" | "MONEY") => true,
        Some("BIGINT") => words.next() == Some("UNSIGNED"),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
