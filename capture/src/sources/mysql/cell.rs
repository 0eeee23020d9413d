//! One decoded column value, independent of the decoding crate: what
//! mysql_common's binlog row parser gives, put in the form the Debezium
//! mapping ([`super::mapping`]) needs.

use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;

use super::shape::ColumnShape;

#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    UInt(u64),
    Float(f32),
    Double(f64),
    /// DECIMAL as exact text.
    Decimal(String),
    /// CHAR/VARCHAR/TEXT/BINARY/BLOB/GEOMETRY: the stored bytes.
    Bytes(Vec<u8>),
    /// DATE; `0000-00-00` is all zeros.
    Date {
        year: u16,
        month: u8,
        day: u8,
    },
    /// DATETIME: a wall-clock reading without zone.
    DateTime {
        year: u16,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
        micros: u32,
    },
    /// TIMESTAMP: seconds since 1970 UTC (0 is the zero timestamp).
    Timestamp {
        secs: i64,
        micros: u32,
    },
    /// TIME, a duration of up to ±838:59:59.
    Time {
        negative: bool,
        hours: u32,
        minutes: u8,
        seconds: u8,
        micros: u32,
    },
    /// YEAR (0 for `0000`).
    Year(u16),
    Json(serde_json::Value),
    /// BIT(n), big-endian as stored.
    Bit(Vec<u8>),
    /// ENUM: the 1-based label index (0: the empty error value).
    Enum(u16),
    /// SET: bit i set means label i is in the set.
    Set(u64),
}

impl Cell {
    /// Converts a decoded binlog value of column `col`. The error says
    /// what did not fit (a protocol problem: the event is not what its
    /// TABLE_MAP announced).
    pub fn from_binlog(col: &ColumnShape, value: BinlogValue<'_>) -> Result<Self, String> {
        let value = match value {
            BinlogValue::Value(v) => v,
            BinlogValue::Jsonb(j) => {
                return serde_json::Value::try_from(j)
                    .map(Cell::Json)
                    .map_err(|e| format!("JSON value does not decode: {e}"));
            }
            BinlogValue::JsonDiff(_) => {
                return Err("a partial JSON update (binlog_row_value_options=PARTIAL_JSON): set binlog_row_value_options to '' so row images carry whole JSON documents".into());
            }
        };
        if value == Value::NULL {
            return Ok(Cell::Null);
        }
        use ColumnType::*;
        match col.ty {
            MYSQL_TYPE_TINY | MYSQL_TYPE_SHORT | MYSQL_TYPE_INT24 | MYSQL_TYPE_LONG
            | MYSQL_TYPE_LONGLONG => integer(col, value),
            MYSQL_TYPE_DATE
            | MYSQL_TYPE_NEWDATE
            | MYSQL_TYPE_DATETIME
            | MYSQL_TYPE_DATETIME2
            | MYSQL_TYPE_TIMESTAMP
            | MYSQL_TYPE_TIMESTAMP2
            | MYSQL_TYPE_TIME
            | MYSQL_TYPE_TIME2
            | MYSQL_TYPE_YEAR => temporal(col, value),
            _ => other(col, value),
        }
    }
}

fn unexpected(col: &ColumnShape, v: &Value) -> String {
    format!("{:?} column holds unexpected {v:?}", col.ty)
}

/// An integer column's value, signed or not.
fn integer(col: &ColumnShape, value: Value) -> Result<Cell, String> {
    use ColumnType::*;
    Ok(match value {
        Value::Int(i) if col.unsigned => {
            // Narrow unsigned types come back as Int; they are never negative.
            Cell::UInt(u64::try_from(i).map_err(|_| unexpected(col, &value))?)
        }
        // mysql_common returns a signed MEDIUMINT's 24 bits without
        // their sign (-8388608 comes as 8388608): extend it.
        Value::Int(i) if col.ty == MYSQL_TYPE_INT24 && i >= 1 << 23 => Cell::Int(i - (1 << 24)),
        Value::Int(i) => Cell::Int(i),
        Value::UInt(u) => Cell::UInt(u),
        v => return Err(unexpected(col, &v)),
    })
}

/// A date or time column's value.
fn temporal(col: &ColumnShape, value: Value) -> Result<Cell, String> {
    use ColumnType::*;
    Ok(match col.ty {
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => match value {
            Value::Date(year, month, day, ..) => Cell::Date { year, month, day },
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_DATETIME | MYSQL_TYPE_DATETIME2 => match value {
            Value::Date(year, month, day, hour, minute, second, micros) => Cell::DateTime {
                year,
                month,
                day,
                hour,
                minute,
                second,
                micros,
            },
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => match value {
            Value::Int(secs) => Cell::Timestamp { secs, micros: 0 },
            // TIMESTAMP2 comes as `secs` or `secs.ffffff` text.
            Value::Bytes(ref b) => {
                let text = std::str::from_utf8(b).map_err(|_| unexpected(col, &value))?;
                let (s, f) = text.split_once('.').unwrap_or((text, "0"));
                Cell::Timestamp {
                    secs: s.parse().map_err(|_| unexpected(col, &value))?,
                    micros: f.parse().map_err(|_| unexpected(col, &value))?,
                }
            }
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_TIME | MYSQL_TYPE_TIME2 => match value {
            Value::Time(negative, days, h, minutes, seconds, micros) => Cell::Time {
                negative,
                hours: days * 24 + u32::from(h),
                minutes,
                seconds,
                micros,
            },
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_YEAR => match value {
            // The parser adds 1900 to the stored byte; 0 stands for
            // `0000` (1901..=2155 are the real years).
            Value::Bytes(ref b) => {
                let y: u16 = std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| unexpected(col, &value))?;
                Cell::Year(if y == 1900 { 0 } else { y })
            }
            Value::Int(y) => Cell::Year(u16::try_from(y).map_err(|_| unexpected(col, &value))?),
            v => return Err(unexpected(col, &v)),
        },
        _ => return Err(unexpected(col, &value)),
    })
}

/// Any other column's value: floating point, decimal, bit, enum, set, JSON
/// text, and bytes (strings and blobs).
fn other(col: &ColumnShape, value: Value) -> Result<Cell, String> {
    use ColumnType::*;
    Ok(match col.ty {
        MYSQL_TYPE_FLOAT => match value {
            Value::Float(f) => Cell::Float(f),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_DOUBLE => match value {
            Value::Double(f) => Cell::Double(f),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => match value {
            Value::Bytes(b) => Cell::Decimal(String::from_utf8(b).map_err(|e| e.to_string())?),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_BIT => match value {
            Value::Bytes(b) => Cell::Bit(b),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_ENUM => match value {
            Value::Int(i) => Cell::Enum(u16::try_from(i).map_err(|_| unexpected(col, &value))?),
            v => return Err(unexpected(col, &v)),
        },
        MYSQL_TYPE_SET => match value {
            Value::Bytes(b) => {
                let mut mask = 0u64;
                for (i, byte) in b.iter().take(8).enumerate() {
                    mask |= u64::from(*byte) << (8 * i);
                }
                Cell::Set(mask)
            }
            v => return Err(unexpected(col, &v)),
        },
        // MariaDB's JSON is a LONGTEXT: parse the text when the catalog
        // says it is JSON.
        MYSQL_TYPE_BLOB | MYSQL_TYPE_TINY_BLOB | MYSQL_TYPE_MEDIUM_BLOB | MYSQL_TYPE_LONG_BLOB
            if col.json =>
        {
            match value {
                Value::Bytes(b) => Cell::Json(
                    serde_json::from_slice(&b)
                        .map_err(|e| format!("JSON text does not parse: {e}"))?,
                ),
                v => return Err(unexpected(col, &v)),
            }
        }
        _ => match value {
            Value::Bytes(b) => Cell::Bytes(b),
            v => return Err(unexpected(col, &v)),
        },
    })
}
