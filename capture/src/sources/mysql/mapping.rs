//! Debezium's MySQL connector type mapping: each column's Kafka Connect
//! field schema and each [`Cell`]'s JSON value, with Debezium's defaults
//! and modes, so that consumers of Debezium's MySQL topics (and oncely's
//! sinks, which read those) read these unchanged.
//!
//! | MySQL | Connect (default modes) |
//! | --- | --- |
//! | TINYINT, SMALLINT | int16 (SMALLINT UNSIGNED int32) |
//! | MEDIUMINT, INT | int32 (INT UNSIGNED int64) |
//! | BIGINT | int64; UNSIGNED by `bigint.unsigned.handling.mode` |
//! | `tinyint(1)` | int16, Debezium's default (boolean with `tinyint.one.as.boolean`, as its `TinyIntOneToBooleanConverter`) |
//! | FLOAT / DOUBLE | `float` (FLOAT32) / `double` (FLOAT64), as Connect's JSON converter names them |
//! | DECIMAL(p,s) | `decimal.handling.mode`: Connect `Decimal` (precise), double, string |
//! | DATE | `io.debezium.time.Date` (days) |
//! | DATETIME(0-3) / (4-6) | `io.debezium.time.Timestamp` (ms) / `MicroTimestamp` (µs) |
//! | TIMESTAMP(n) | `io.debezium.time.ZonedTimestamp` (UTC text, n fraction digits) |
//! | TIME(n) | `io.debezium.time.MicroTime` (µs) |
//! | YEAR | `io.debezium.time.Year` (int32) |
//! | CHAR/VARCHAR/TEXT | string; binary ones bytes (base64 in JSON) |
//! | ENUM / SET | `io.debezium.data.Enum` / `EnumSet` strings, labels in `allowed` |
//! | JSON | `io.debezium.data.Json` (text; MariaDB's as stored) |
//! | BIT(1) / BIT(n) | boolean / `io.debezium.data.Bits` (little-endian bytes, `length`) |
//! | GEOMETRY | `io.debezium.data.geometry.Geometry` {wkb, srid}; a POINT column `Point` {x, y, wkb, srid}; SRID 0 null |
//!
//! Zero dates (`0000-00-00`, a zero DATETIME or TIMESTAMP) follow Debezium:
//! null in a nullable column, the epoch in a NOT NULL one.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use mysql_async::consts::ColumnType;

use super::cell::Cell;
use super::shape::ColumnShape;
use oncely_core::calendar::days_from_civil;

pub use crate::config::mysql::{
    BigintUnsignedHandlingMode, DecimalHandlingMode, MappingConfig, TimePrecisionMode,
};

/// Why a value cannot be published: the change is refused (dead letter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("{value} does not fit int64: set bigint.unsigned.handling.mode = \"precise\"")]
    UnsignedOverflow { value: u64 },
    #[error("text is not valid UTF-8 (a character set other than utf8/utf8mb4/ascii?)")]
    InvalidUtf8,
    #[error("DECIMAL text {0:?} does not parse")]
    Decimal(String),
}

fn b64(bytes: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The Connect field schema of `col`, named `col.name`.
pub fn field_schema(cfg: &MappingConfig, col: &ColumnShape, optional: bool) -> Value {
    let mut m = Map::new();
    let (ty, name, params): (&str, Option<&str>, Option<Value>) = schema_parts(cfg, col);
    m.insert("type".into(), json!(ty));
    let point = is_point(col);
    if ty == "struct" {
        let fields = if point {
            json!([
                {"type": "double", "optional": false, "field": "x"},
                {"type": "double", "optional": false, "field": "y"},
                {"type": "bytes", "optional": true, "field": "wkb"},
                {"type": "int32", "optional": true, "field": "srid"}
            ])
        } else {
            json!([
                {"type": "bytes", "optional": false, "field": "wkb"},
                {"type": "int32", "optional": true, "field": "srid"}
            ])
        };
        m.insert("fields".into(), fields);
    }
    m.insert("optional".into(), json!(optional));
    if let Some(name) = name {
        m.insert("name".into(), json!(name));
        m.insert("version".into(), json!(1));
    }
    if let Some(p) = params {
        m.insert("parameters".into(), p);
    }
    if ty == "struct" {
        // Debezium's Geometry and Point schemas carry a doc.
        let doc = if point {
            "Geometry (POINT)"
        } else {
            "Geometry"
        };
        m.insert("doc".into(), json!(doc));
    }
    m.insert("field".into(), json!(col.name));
    Value::Object(m)
}

fn fsp(col: &ColumnShape) -> u8 {
    col.meta_byte(0).min(6)
}

fn bit_length(col: &ColumnShape) -> u32 {
    u32::from(col.meta_byte(1)) * 8 + u32::from(col.meta_byte(0))
}

fn decimal_params(precision: u32, scale: u32) -> Value {
    json!({"scale": scale.to_string(), "connect.decimal.precision": precision.to_string()})
}

fn schema_parts(
    cfg: &MappingConfig,
    col: &ColumnShape,
) -> (&'static str, Option<&'static str>, Option<Value>) {
    use ColumnType::*;
    if col.json {
        return ("string", Some("io.debezium.data.Json"), None);
    }
    match col.ty {
        MYSQL_TYPE_TINY if cfg.tinyint_one_as_boolean && col.is_tinyint1() => {
            ("boolean", None, None)
        }
        MYSQL_TYPE_TINY => ("int16", None, None),
        MYSQL_TYPE_SHORT if col.unsigned => ("int32", None, None),
        MYSQL_TYPE_SHORT => ("int16", None, None),
        MYSQL_TYPE_INT24 => ("int32", None, None),
        MYSQL_TYPE_LONG if col.unsigned => ("int64", None, None),
        MYSQL_TYPE_LONG => ("int32", None, None),
        MYSQL_TYPE_LONGLONG
            if col.unsigned && cfg.bigint_unsigned == BigintUnsignedHandlingMode::Precise =>
        {
            (
                "bytes",
                Some("org.apache.kafka.connect.data.Decimal"),
                Some(decimal_params(20, 0)),
            )
        }
        MYSQL_TYPE_LONGLONG => ("int64", None, None),
        // Connect's FLOAT32 and FLOAT64 as the JSON converter names them.
        MYSQL_TYPE_FLOAT => ("float", None, None),
        MYSQL_TYPE_DOUBLE => ("double", None, None),
        MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => match cfg.decimal {
            DecimalHandlingMode::Precise => (
                "bytes",
                Some("org.apache.kafka.connect.data.Decimal"),
                Some(decimal_params(
                    u32::from(col.meta_byte(0)),
                    u32::from(col.meta_byte(1)),
                )),
            ),
            DecimalHandlingMode::Double => ("double", None, None),
            DecimalHandlingMode::String => ("string", None, None),
        },
        MYSQL_TYPE_DATE
        | MYSQL_TYPE_NEWDATE
        | MYSQL_TYPE_DATETIME
        | MYSQL_TYPE_DATETIME2
        | MYSQL_TYPE_TIMESTAMP
        | MYSQL_TYPE_TIMESTAMP2
        | MYSQL_TYPE_TIME
        | MYSQL_TYPE_TIME2 => temporal_schema_parts(cfg, col),
        MYSQL_TYPE_YEAR => ("int32", Some("io.debezium.time.Year"), None),
        MYSQL_TYPE_BIT if bit_length(col) == 1 => ("boolean", None, None),
        MYSQL_TYPE_BIT => (
            "bytes",
            Some("io.debezium.data.Bits"),
            Some(json!({"length": bit_length(col).to_string()})),
        ),
        MYSQL_TYPE_ENUM => (
            "string",
            Some("io.debezium.data.Enum"),
            Some(json!({"allowed": col.labels.join(",")})),
        ),
        MYSQL_TYPE_SET => (
            "string",
            Some("io.debezium.data.EnumSet"),
            Some(json!({"allowed": col.labels.join(",")})),
        ),
        MYSQL_TYPE_GEOMETRY if is_point(col) => {
            ("struct", Some("io.debezium.data.geometry.Point"), None)
        }
        MYSQL_TYPE_GEOMETRY => ("struct", Some("io.debezium.data.geometry.Geometry"), None),
        _ if col.binary => ("bytes", None, None),
        _ => ("string", None, None),
    }
}

/// [`schema_parts`] of a date or time column, as `time.precision.mode` says.
fn temporal_schema_parts(
    cfg: &MappingConfig,
    col: &ColumnShape,
) -> (&'static str, Option<&'static str>, Option<Value>) {
    use ColumnType::*;
    match col.ty {
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => match cfg.time {
            TimePrecisionMode::AdaptiveTimeMicroseconds => {
                ("int32", Some("io.debezium.time.Date"), None)
            }
            TimePrecisionMode::Connect => {
                ("int32", Some("org.apache.kafka.connect.data.Date"), None)
            }
        },
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => match cfg.time {
            TimePrecisionMode::AdaptiveTimeMicroseconds if fsp(col) <= 3 => {
                ("int64", Some("io.debezium.time.Timestamp"), None)
            }
            TimePrecisionMode::AdaptiveTimeMicroseconds => {
                ("int64", Some("io.debezium.time.MicroTimestamp"), None)
            }
            TimePrecisionMode::Connect => (
                "int64",
                Some("org.apache.kafka.connect.data.Timestamp"),
                None,
            ),
        },
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => {
            ("string", Some("io.debezium.time.ZonedTimestamp"), None)
        }
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => match cfg.time {
            TimePrecisionMode::AdaptiveTimeMicroseconds => {
                ("int64", Some("io.debezium.time.MicroTime"), None)
            }
            TimePrecisionMode::Connect => {
                ("int32", Some("org.apache.kafka.connect.data.Time"), None)
            }
        },
        // Not a date or time type: schema_parts sends none here.
        _ => ("string", None, None),
    }
}

/// Whether a cell is one of MySQL's zero dates.
fn is_zero_date(cell: &Cell) -> bool {
    match cell {
        Cell::Date { month, day, .. } | Cell::DateTime { month, day, .. } => {
            *month == 0 || *day == 0
        }
        Cell::Timestamp { secs, micros } => *secs == 0 && *micros == 0,
        _ => false,
    }
}

/// The JSON value of `cell` in column `col`.
pub fn to_json(cfg: &MappingConfig, col: &ColumnShape, cell: &Cell) -> Result<Value, MappingError> {
    use ColumnType::*;
    if matches!(cell, Cell::Null) {
        return Ok(Value::Null);
    }
    if is_zero_date(cell) {
        // Debezium: null when the column allows it, else the epoch.
        if col.nullable {
            return Ok(Value::Null);
        }
        return Ok(match col.ty {
            MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => json!(format_zoned(0, 0, fsp(col))),
            _ => json!(0),
        });
    }
    Ok(match cell {
        Cell::Null => Value::Null,
        Cell::Json(v) => json!(v.to_string()),
        Cell::JsonText(t) => json!(t),
        Cell::Int(i) => match col.ty {
            MYSQL_TYPE_TINY if cfg.tinyint_one_as_boolean && col.is_tinyint1() => json!(*i != 0),
            _ => json!(i),
        },
        Cell::UInt(u) => unsigned_json(cfg, col, *u)?,
        Cell::Float(f) => float(single(*f)),
        Cell::Double(f) => float(*f),
        Cell::Decimal(text) => decimal_json(cfg, col, text)?,
        Cell::Bytes(b) => bytes_json(col, b)?,
        Cell::Date { year, month, day } => json!(days(*year, *month, *day)),
        Cell::DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micros,
        } => {
            let secs = days(*year, *month, *day) * 86_400
                + i64::from(*hour) * 3600
                + i64::from(*minute) * 60
                + i64::from(*second);
            let us = secs * 1_000_000 + i64::from(*micros);
            let micro = cfg.time == TimePrecisionMode::AdaptiveTimeMicroseconds && fsp(col) > 3;
            json!(if micro { us } else { us.div_euclid(1000) })
        }
        Cell::Timestamp { secs, micros } => json!(format_zoned(*secs, *micros, fsp(col))),
        Cell::Time {
            negative,
            hours,
            minutes,
            seconds,
            micros,
        } => {
            let us = (i64::from(*hours) * 3600 + i64::from(*minutes) * 60 + i64::from(*seconds))
                * 1_000_000
                + i64::from(*micros);
            time_json(cfg, if *negative { -us } else { us })
        }
        Cell::Year(y) => json!(y),
        Cell::Bit(bytes) => bit_json(col, bytes),
        Cell::Enum(i) => {
            let label = usize::from(*i)
                .checked_sub(1)
                .and_then(|i| col.labels.get(i));
            json!(label.map(String::as_str).unwrap_or(""))
        }
        Cell::Set(mask) => {
            let labels: Vec<&str> = col
                .labels
                .iter()
                .enumerate()
                .filter(|(i, _)| *i < 64 && mask & (1u64 << i) != 0)
                .map(|(_, l)| l.as_str())
                .collect();
            json!(labels.join(","))
        }
    })
}

/// An unsigned integer: BIGINT UNSIGNED as `bigint.unsigned.handling.mode`
/// says, TINYINT(1) as a boolean when asked.
fn unsigned_json(cfg: &MappingConfig, col: &ColumnShape, u: u64) -> Result<Value, MappingError> {
    use ColumnType::*;
    Ok(match col.ty {
        MYSQL_TYPE_LONGLONG => match cfg.bigint_unsigned {
            BigintUnsignedHandlingMode::Long => {
                json!(i64::try_from(u).map_err(|_| MappingError::UnsignedOverflow { value: u })?)
            }
            BigintUnsignedHandlingMode::Precise => b64(&twos_complement(&u.to_string())),
        },
        MYSQL_TYPE_TINY if cfg.tinyint_one_as_boolean && col.is_tinyint1() => json!(u != 0),
        _ => json!(u),
    })
}

/// A POINT column (declared so: the binlog says only GEOMETRY), which
/// Debezium writes as its `Point` with the coordinates.
fn is_point(col: &ColumnShape) -> bool {
    col.ty == ColumnType::MYSQL_TYPE_GEOMETRY
        && col
            .declared
            .as_deref()
            .is_some_and(|d| d.trim().eq_ignore_ascii_case("point"))
}

/// The coordinates of a WKB point: byte order, type 1, x and y.
fn point_xy(wkb: &[u8]) -> Option<(f64, f64)> {
    let (&order, rest) = wkb.split_first()?;
    let num = |b: &[u8]| -> Option<[u8; 8]> { b.try_into().ok() };
    let (ty, x, y) = (
        rest.get(..4)?,
        num(rest.get(4..12)?)?,
        num(rest.get(12..20)?)?,
    );
    match order {
        1 if ty == [1, 0, 0, 0] => Some((f64::from_le_bytes(x), f64::from_le_bytes(y))),
        0 if ty == [0, 0, 0, 1] => Some((f64::from_be_bytes(x), f64::from_be_bytes(y))),
        _ => None,
    }
}

/// A DECIMAL as `decimal.handling.mode` says.
fn decimal_json(cfg: &MappingConfig, col: &ColumnShape, text: &str) -> Result<Value, MappingError> {
    Ok(match cfg.decimal {
        DecimalHandlingMode::String => json!(text),
        DecimalHandlingMode::Double => float(
            text.parse()
                .map_err(|_| MappingError::Decimal(text.to_owned()))?,
        ),
        DecimalHandlingMode::Precise => {
            let scale = usize::from(col.meta_byte(1));
            b64(&twos_complement(
                &unscaled(text, scale).ok_or_else(|| MappingError::Decimal(text.to_owned()))?,
            ))
        }
    })
}

/// Bytes: a geometry, a binary string (base64) or text.
fn bytes_json(col: &ColumnShape, b: &[u8]) -> Result<Value, MappingError> {
    Ok(match col.ty {
        ColumnType::MYSQL_TYPE_GEOMETRY => {
            // MySQL's internal geometry: a little-endian SRID, then WKB.
            let (srid, wkb) = if b.len() >= 4 {
                b.split_at(4)
            } else {
                (&[][..], b)
            };
            // Debezium writes SRID 0 (none given) as null.
            let srid = <[u8; 4]>::try_from(srid)
                .map(i32::from_le_bytes)
                .ok()
                .filter(|&s| s != 0);
            match point_xy(wkb).filter(|_| is_point(col)) {
                Some((x, y)) => {
                    json!({"x": float(x), "y": float(y), "wkb": b64(wkb), "srid": srid})
                }
                None => json!({"wkb": b64(wkb), "srid": srid}),
            }
        }
        _ if col.binary => b64(b),
        _ => json!(std::str::from_utf8(b).map_err(|_| MappingError::InvalidUtf8)?),
    })
}

/// A TIME of `us` microseconds, as `time.precision.mode` says.
fn time_json(cfg: &MappingConfig, us: i64) -> Value {
    match cfg.time {
        TimePrecisionMode::AdaptiveTimeMicroseconds => json!(us),
        TimePrecisionMode::Connect => json!(us.div_euclid(1000)),
    }
}

/// A BIT: BIT(1) as a boolean, wider ones as Connect's little-endian Bits.
fn bit_json(col: &ColumnShape, bytes: &[u8]) -> Value {
    if bit_length(col) == 1 {
        json!(bytes.iter().any(|b| *b != 0))
    } else {
        // Connect's Bits are little-endian; MySQL stores big-endian.
        let mut le = bytes.to_vec();
        le.reverse();
        b64(&le)
    }
}

/// Days since 1970-01-01 of a valid date (zero dates are handled before).
fn days(year: u16, month: u8, day: u8) -> i64 {
    days_from_civil(i64::from(year), u32::from(month), u32::from(day)).unwrap_or(0)
}

/// Non-finite floats as Kafka Connect's JSON converter writes them (MySQL
/// stores none, but a value is never dropped silently).
/// A FLOAT as the double Debezium writes: the shortest decimal that reads
/// back as the same single-precision value (`0.1`, not the widened
/// `0.10000000149011612`).
fn single(f: f32) -> f64 {
    f.to_string().parse().unwrap_or(f64::from(f))
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f)
        .map(Value::Number)
        .unwrap_or_else(|| {
            json!(if f.is_nan() {
                "NaN"
            } else if f > 0.0 {
                "Infinity"
            } else {
                "-Infinity"
            })
        })
}

/// `YYYY-MM-DDTHH:MM:SS[.f…]Z` with `fsp` fraction digits, UTC.
fn format_zoned(secs: i64, micros: u32, fsp: u8) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = oncely_core::calendar::civil_from_days(days);
    let mut out = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    if fsp > 0 {
        let frac = format!("{micros:06}");
        out.push('.');
        out.push_str(&frac[..usize::from(fsp)]);
    }
    out.push('Z');
    out
}

/// The unscaled integer text of a decimal at `scale` (`-12.5`, 2 -> `-1250`).
fn unscaled(text: &str, scale: usize) -> Option<String> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if frac.len() > scale || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut out = String::with_capacity(int.len() + scale + 1);
    if neg {
        out.push('-');
    }
    out.push_str(int);
    out.push_str(frac);
    out.extend(std::iter::repeat_n('0', scale - frac.len()));
    Some(out)
}

/// The minimal big-endian two's-complement bytes of a decimal integer
/// text (Connect's `Decimal` unscaled value, Java's BigInteger bytes).
fn twos_complement(int_text: &str) -> Vec<u8> {
    let (neg, digits) = match int_text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, int_text),
    };
    // Magnitude in base 256, little-endian, by repeated multiply-add.
    let mut mag: Vec<u8> = Vec::new();
    for d in digits.bytes().map(|b| u32::from(b - b'0')) {
        let mut carry = d;
        for byte in mag.iter_mut() {
            let v = u32::from(*byte) * 10 + carry;
            *byte = (v & 0xff) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            mag.push((carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    while mag.last() == Some(&0) {
        mag.pop();
    }
    if neg && !mag.is_empty() {
        // Two's complement: invert and add one.
        let mut carry = 1u16;
        for byte in mag.iter_mut() {
            let v = u16::from(!*byte) + carry;
            *byte = (v & 0xff) as u8;
            carry = v >> 8;
        }
        if mag.last().is_some_and(|b| b & 0x80 == 0) {
            mag.push(0xff);
        }
    } else if mag.last().is_none_or(|b| b & 0x80 != 0) {
        mag.push(0);
    }
    mag.reverse();
    mag
}

#[cfg(test)]
mod tests;
